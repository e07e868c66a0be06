"""The default model path (`quantize: auto` for configs/default.yaml's pools) is accurate on
short texts: on the CPU the suite runs on (so a run on an AVX2-only CPU catches what its int8
kernels lose), and under AVX2's int8 kernels forced on any CPU (CTranslate2's oneDNN path
capped at AVX2, ONNX Runtime's 7-bit weights: what an AMD EPYC without VNNI computes;
docs/accuracy.md). Judged on short sentences the gate never judged on, by the gate's own bar,
as benchmarks/short_texts.py measures it.

Each choice is made as a start makes it, with the gate's passages cut to 64 (every short
text kept: the bands these tests are about), in a cache of its own, so that no other test
reads its verdicts. The forced kernels' choice runs in a process of its own (CTranslate2
picks its kernels when it loads), started with the module, so that it runs beside the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.short_texts import AVX2_KERNELS, REPO, default_on_short_sentences
from numaserve.tasks.agreement import COSINE_FLOOR, COSINE_SHARE
from tests.harness.caches import own_choices

PASSAGES = 64
CHOOSE_AS_AVX2 = f"""
import json
import numaserve.backends.gate
from benchmarks.short_texts import default_on_short_sentences
numaserve.backends.gate.GATE_TEXTS = {PASSAGES}
print(json.dumps(default_on_short_sentences(("avx2",))))
"""


@pytest.fixture(scope="module")
def as_on_avx2(tmp_path_factory):
    """The default chosen as on an AVX2-only CPU, under its kernels, in a process started
    now: its result, once asked for."""
    cache = own_choices(tmp_path_factory.mktemp("avx2-choice"))
    env = {**os.environ, **AVX2_KERNELS, "NUMASERVE_CACHE": str(cache)}
    process = subprocess.Popen(
        [sys.executable, "-c", CHOOSE_AS_AVX2],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def result() -> dict:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        return json.loads(out.splitlines()[-1])

    yield result
    if process.poll() is None:
        process.kill()
        process.communicate()


def runs_avx2_kernels_itself() -> bool:
    """An AVX2-only CPU that CTranslate2 runs oneDNN on (not Intel's: MKL): the forced
    kernels are its own, and the test under them judges what this CPU's would."""
    from numaserve.host.topology import read_topology

    intel = "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    return read_topology().isa == ("avx2",) and not intel


# A choice made beside the forced kernels' (145 s on 2 AVX2 vCPUs, more beside a second
# test worker).
@pytest.mark.timeout(700)
@pytest.mark.skipif(
    runs_avx2_kernels_itself(),
    reason="this CPU runs AVX2's kernels itself: the forced-kernels test judges the same",
)
def test_the_default_is_accurate_on_short_sentences_on_this_cpu(
    as_on_avx2, choice_cache, monkeypatch
):
    from numaserve.host.topology import read_topology

    monkeypatch.setattr("numaserve.backends.gate.GATE_TEXTS", PASSAGES)
    found = default_on_short_sentences(read_topology().isa)
    assert found["texts"] >= 200
    assert found["share"] >= COSINE_SHARE and found["lowest"] >= COSINE_FLOOR, found


@pytest.mark.timeout(700)  # a choice of its own: the ISA differs, and int8 builds 7-bit weights
def test_the_default_is_accurate_on_short_sentences_under_avx2_int8_kernels(as_on_avx2):
    found = as_on_avx2()
    assert found["texts"] >= 200
    assert found["share"] >= COSINE_SHARE and found["lowest"] >= COSINE_FLOOR, found
