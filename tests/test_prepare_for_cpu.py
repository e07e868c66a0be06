"""`numaserve prepare --for-cpu`: an image or a build host prepares for the fleet's CPU, so
that its first start finds the choice kept. The target's extensions come from a file
`numaserve topology --json` wrote on it or a list; this CPU's kernels are capped to the
target's (backends/target.py); a target with an extension this CPU lacks is refused."""

import json

import pytest

from numaserve.backends.target import TargetError, kernels_for
from numaserve.host.isa import INTERESTING_ISA, IsaError, detect_isa, read_isa
from tests.harness.caches import own_choices
from tests.harness.console import numaserve

SAPPHIRE_RAPIDS = INTERESTING_ISA
ZEN4 = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16")
ZEN2 = ("avx2",)


def test_the_target_is_read_from_what_topology_json_wrote_there(tmp_path):
    written = numaserve("topology", "--json")
    assert written.returncode == 0, written.stderr
    there = tmp_path / "fleet.json"
    there.write_text(written.stdout)
    assert read_isa(str(there)) == detect_isa() == tuple(json.loads(written.stdout)["isa"])


def test_the_target_is_read_from_a_list_in_the_kernels_order():
    assert read_isa("avx512_vnni, avx2,avx512f") == ("avx2", "avx512f", "avx512_vnni")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("avx2,avx512_fp16", "unknown extensions avx512_fp16"),
        ("avx512f", "no avx2"),
        ("", "no avx2"),
    ],
)
def test_a_target_that_names_no_cpu_is_refused_saying_what_it_takes(value, said):
    with pytest.raises(IsaError, match=said) as e:
        read_isa(value)
    assert "numaserve topology --json" in str(e.value)


def test_a_file_that_topology_did_not_write_is_refused(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"sockets": 1}')
    with pytest.raises(IsaError, match="not what `numaserve topology --json` writes"):
        read_isa(str(other))


def test_a_target_like_this_cpu_runs_its_own_kernels():
    assert kernels_for(ZEN4, ZEN4) == {}


def test_an_avx2_target_runs_amds_avx2_kernels_without_mkl():
    assert kernels_for(ZEN2, SAPPHIRE_RAPIDS) == {"CT2_USE_MKL": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    with_vnni = ("avx2", "avx_vnni")
    assert kernels_for(with_vnni, SAPPHIRE_RAPIDS)["ONEDNN_MAX_CPU_ISA"] == "AVX2_VNNI"


def test_an_avx512_target_runs_onednn_capped_at_its_extensions():
    assert kernels_for(ZEN4, SAPPHIRE_RAPIDS) == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    cascade_lake = ("avx2", "avx512f", "avx512_vnni")
    assert kernels_for(cascade_lake, SAPPHIRE_RAPIDS) == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}
    skylake = ("avx2", "avx512f")
    assert kernels_for(skylake, SAPPHIRE_RAPIDS) == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}


def test_a_target_with_an_extension_this_cpu_lacks_is_refused():
    with pytest.raises(
        TargetError, match="has avx512_bf16, avx_vnni, amx_tile, amx_int8, amx_bf16, which"
    ):
        kernels_for(SAPPHIRE_RAPIDS, ("avx2", "avx512f", "avx512_vnni"))


def test_prepare_refuses_an_unknown_target_before_any_work(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {path: bundled:minilm}\n")
    r = numaserve("prepare", "--config", config, "--for-cpu", "avx2,sse9")
    assert r.returncode == 2
    assert "unknown extensions sse9" in r.stderr
    assert "quantize: auto" not in r.stderr  # nothing was judged


@pytest.mark.slow
def test_prepare_for_an_avx2_cpu_keeps_a_choice_that_cpus_start_finds(tmp_path, monkeypatch):
    from numaserve.backends.choice import Batching, bands, ensure_choice
    from numaserve.config.schema import load_config
    from tests.harness.checkpoints import save_tiny_model

    model = save_tiny_model(tmp_path / "embed", "bert", "embed")
    config = tmp_path / "tiny.yaml"
    config.write_text(
        f"model: {{path: {model}, max_length: 64}}\n"
        "placement: {pools: [{name: main, max_tokens: 64, instances: 1}]}\n"
    )
    cache = own_choices(tmp_path / "cache")

    r = numaserve(
        "prepare",
        "--config",
        config,
        "--for-cpu",
        "avx2",
        env={"NUMASERVE_CACHE": str(cache)},
        timeout=300,
    )

    assert r.returncode == 0, r.stderr[-3000:]
    kernels = kernels_for(ZEN2, detect_isa())
    capped = " ".join(f"{k}={v}" for k, v in kernels.items())
    assert "preparing for a CPU with avx2: judged and timed on " in r.stderr
    assert capped in r.stderr
    # an AVX2 CPU's start (its ISA) finds the choice: nothing is loaded, judged or raced
    monkeypatch.setenv("NUMASERVE_CACHE", str(cache))
    served = load_config(str(config))
    (entry,) = served.models

    def nothing_loads(*_):
        raise AssertionError("the kept choice was not found: a start would choose again")

    pools = bands(entry.pools, entry.max_length)
    batching = Batching(served.server.max_batch, served.server.max_batch_tokens)
    kept = ensure_choice(entry.model, ZEN2, nothing_loads, pools, batching)
    tried = {t["path"]: t for t in kept.trials}
    # chosen among what an AVX2 CPU runs: no bf16, and no int16 (CTranslate2 without MKL)
    assert "bfloat16" in tried["openvino bf16"]["skipped"]
    assert "int16" in tried["ctranslate2 int16"]["skipped"]
    assert "bf16" not in str(kept.for_pool("main").path)
