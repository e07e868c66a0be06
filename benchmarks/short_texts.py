"""The frontier of model paths on short texts and on passages, model alone: how accurate
and how fast each is, the default among them, on this CPU's int8 kernels or on an AVX2-only
CPU's (--avx2).

The default is what a start of configs/default.yaml runs: `numaserve prepare` (the per-band
gate, the race) for its pool, then its instance's model as prepare resolved it (one path, or
one per band of lengths). Beside it, every path in PATHS: each one offered, and int8 with more
layers kept in fp32. Against torch fp32, on texts the gate never judged:
- short: the standard library's first sentences of at most 24 tokens;
- long: 120 of its docstring passages of 65-256 tokens;
each path's share at cosine >= 0.99 and its lowest; its time per text at batch 1 on one
pinned core, all paths in alternating rounds (race.py), and its ratio to ONNX Runtime int8's
round by round (median). With `--sts DIR` (SemEval STS 2016's five `*.test.tsv`, as
benchmarks/sts.py reads them; 14 tokens at the median), Spearman x 100 over all pairs, and
the share of its sentences at cosine >= 0.99.

`--avx2`: chosen and run as on an AVX2-only CPU (AMD EPYC before Zen 4): the ISA told to the
choice is `avx2` (ONNX Runtime's int8 keeps 7-bit weights, as it does there), and
CTranslate2's kernels must be forced in the environment, `CT2_USE_MKL=0
ONEDNN_MAX_CPU_ISA=AVX2` (its oneDNN path, as on a non-Intel CPU, capped at AVX2: its int8
products then saturate in int16, and it runs no int16). ONNX Runtime's and OpenVINO's kernels
stay this CPU's: with 7-bit weights ONNX Runtime's products are exact on either, so its
accuracy is AVX2's; its speed is not.

Run:  .venv/bin/python -m benchmarks.short_texts [--avx2] [--sts DIR] [--rounds 5] [--cpu 1]
          [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
AVX2_KERNELS = {"CT2_USE_MKL": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"}
LONGEST = 24  # tokens: queries, titles, captions


def prepared_default(isa: tuple[str, ...]):
    """The default config's pool's model, prepared and loaded as a start does: (model, the
    pool's record entry, the served model's settings)."""
    from numaserve.backends import load_prepared, prepare_model
    from numaserve.backends.choice import Batching, bands
    from numaserve.config.schema import load_config

    config = load_config(str(REPO / "configs/default.yaml"))
    (served,) = config.models
    pools = bands(served.pools, served.max_length)
    batching = Batching(config.server.max_batch, config.server.max_batch_tokens)
    record = prepare_model(served.model, isa, pools, batching)
    if record is None:
        raise SystemExit("the default config could not be prepared (the log says why)")
    pool = pools[0].pool
    with tempfile.TemporaryDirectory() as directory:
        record.write(Path(directory) / "record.json")
        model = load_prepared(served.model, pool, f"{directory}/record.json", isa, 1)
    return model, record.pools[pool], served


def held_out_short_sentences(tokenizer) -> list[str]:
    """The standard library's first sentences of at most LONGEST tokens that the gate does
    not judge on."""
    from numaserve.backends.gate import gate_corpus
    from numaserve.corpus import stdlib_sentences

    judged = set(gate_corpus())
    texts = [t for t in stdlib_sentences() if t not in judged]
    return [t for t, e in zip(texts, tokenizer.encode(texts), strict=True) if len(e.ids) <= LONGEST]


def vectors(model, encoded) -> np.ndarray:
    return np.stack([np.asarray(model.run([list(e.ids)])[0], dtype=np.float64) for e in encoded])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def accuracy(found: np.ndarray) -> dict:
    from numaserve.tasks.agreement import COSINE_BAR

    return {
        "share": round(float(np.mean(found >= COSINE_BAR)), 4),
        "lowest": round(float(found.min()), 4),
    }


def default_on_short_sentences(isa: tuple[str, ...]) -> dict:
    """The default's accuracy against torch fp32 on the held-out short sentences."""
    from numaserve.backends import load_model
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.config.schema import ModelConfig

    model, entry, served = prepared_default(isa)
    reference = load_model(ModelConfig(backend="torch", quantize="none"), isa)
    tokenizer = Tokenizer(served.model.path, served.model.max_length)
    encoded = tokenizer.encode(held_out_short_sentences(tokenizer))
    return {
        "texts": len(encoded),
        **accuracy(cosines(vectors(model, encoded), vectors(reference, encoded))),
        "paths": paths_of(entry),
    }


def paths_of(entry) -> list[str]:
    return [f"<= {b.last} tokens: {b.path}" for b in entry.shorter] + [str(entry.path)]


# Every path offered, and int8 with more layers kept in fp32 (not offered): the frontier.
PATHS = (
    "onnxruntime int8",
    "onnxruntime int8 keep_fp32 *.output.dense",
    "onnxruntime int8 keep_fp32 *.output.dense,*.attention.self.*",
    "onnxruntime int8 keep_fp32 *.output.dense,*.intermediate.dense",
    "ctranslate2 int8",
    "ctranslate2 int16",
    "onnxruntime none",
    "openvino none",
    "ctranslate2 none",
)


def load_path(name: str, isa: tuple[str, ...]):
    """A path as ModelPath spells it, loaded for one thread; None where it cannot run here."""
    from numaserve.backends import load_model
    from numaserve.checkpoint.errors import ModelLoadError
    from numaserve.config.schema import ModelConfig

    backend, quantize, *keep = name.split()
    globs = tuple(keep[1].split(",")) if keep else ()
    try:
        return load_model(ModelConfig(backend=backend, quantize=quantize, keep_fp32=globs), isa, 1)
    except ModelLoadError as e:
        print(f"{name}: cannot run here: {e}")
        return None


def long_passages(tokenizer, count: int = 120) -> list[str]:
    """Passages of 65-256 tokens the gate does not judge on, spread over those lengths."""
    from numaserve.backends.gate import gate_corpus, gate_texts
    from numaserve.corpus import stdlib_passages

    judged = set(gate_corpus())
    texts = [t for t in stdlib_passages() if t not in judged]
    lengths = [len(e.ids) for e in tokenizer.encode(texts)]
    return gate_texts([t for t, n in zip(texts, lengths, strict=True) if 65 <= n <= 256], count)


def sts(directory: Path, models: dict, tokenizer) -> dict:
    """Spearman x 100 over all pairs, and each model's sentences against the first's."""
    from benchmarks.sts import read_sets, spearman

    sets = read_sets(directory)
    out, first = {}, None
    for name, model in models.items():
        embedded = {}

        def embed(texts, model=model, embedded=embedded):
            found = vectors(model, tokenizer.encode(texts))
            embedded.update(zip(texts, found, strict=True))
            return found

        out[name] = {"spearman": spearman(sets, embed)["all"]}
        if first is None:
            first = embedded
        else:
            texts = sorted(first)
            out[name] |= accuracy(
                cosines(np.stack([embedded[t] for t in texts]), np.stack([first[t] for t in texts]))
            )
    return out


def speed(models: dict, encoded, rounds: int) -> dict:
    """Each model's ms per text and its ratios to ONNX Runtime int8's, round by round."""
    from numaserve.backends.gate import run_in_batches
    from numaserve.backends.race import race, ratios

    standings = race({n: partial(run_in_batches, m) for n, m in models.items()}, encoded, rounds)
    base = next(s for s in standings if s.name == "onnxruntime int8")
    return {
        s.name: {
            "ms": round(s.median, 3),
            "vs onnxruntime int8": [round(1 / r, 3) for r in ratios(base, s)],
        }
        for s in standings
    }


def table(result: dict) -> None:
    """Each path's accuracy and speed on short and long texts, one line each."""
    print(
        f"{'path':62s} {'short: >=0.99  lowest   ms  x ORT int8':40s} long: >=0.99  lowest   ms  x ORT int8"
    )
    for name in result["short"]:
        if name == "texts":
            continue
        cells = []
        for kind in ("short", "long"):
            f = result[kind][name]
            x = sorted(f["vs onnxruntime int8"])[len(f["vs onnxruntime int8"]) // 2]
            cells.append(f"{f['share']:7.1%} {f['lowest']:.4f} {f['ms']:5.2f} {x:5.2f}x")
        print(f"{name:62s}       {cells[0]:34s}       {cells[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--avx2", action="store_true", help="as on an AVX2-only CPU")
    parser.add_argument("--sts", type=Path, help="SemEval STS 2016's *.test.tsv files")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.avx2 and (missing := [k for k, v in AVX2_KERNELS.items() if os.environ.get(k) != v]):
        sys.exit(f"--avx2: set {' '.join(f'{k}={AVX2_KERNELS[k]}' for k in missing)} first")
    os.sched_setaffinity(0, {args.cpu})  # before any runtime starts its threads

    from numaserve.backends import load_model
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.config.schema import ModelConfig
    from numaserve.host.topology import read_topology

    real = read_topology().isa
    isa = ("avx2",) if args.avx2 else real
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((li.split(":", 1)[1].strip() for li in cpuinfo if "model name" in li), "unknown")
    kernels = "AVX2's, forced (" + " ".join(f"{k}={v}" for k, v in AVX2_KERNELS.items()) + ")"
    print(f"CPU: {cpu}; ISA: {' '.join(real)}; int8 kernels: {kernels if args.avx2 else 'its own'}")
    result: dict = {"cpu": cpu, "isa": real, "chosen_for": isa, "forced_avx2": args.avx2}

    model, entry, served = prepared_default(isa)
    tokenizer = Tokenizer(served.model.path, served.model.max_length)
    result["default"] = paths_of(entry)
    print(f"the default here: {', '.join(result['default'])}")
    models = {"fp32": load_model(ModelConfig(backend="torch", quantize="none"), isa, 1)}
    models["default"] = model
    models |= {name: m for name in PATHS if (m := load_path(name, isa)) is not None}
    texts = {
        "short": tokenizer.encode(held_out_short_sentences(tokenizer)),
        "long": tokenizer.encode(long_passages(tokenizer)),
    }
    for kind, encoded in texts.items():
        found = {name: vectors(m, encoded) for name, m in models.items()}
        result[kind] = {"texts": len(encoded)} | {
            name: accuracy(cosines(v, found["fp32"])) for name, v in found.items() if name != "fp32"
        }
    if args.sts:
        result["sts16"] = sts(args.sts, models, tokenizer)
    del models["fp32"]
    for kind, encoded in texts.items():
        for name, figures in speed(models, encoded, args.rounds).items():
            result[kind][name] |= figures
    table(result)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
