"""Semantic similarity on a published benchmark, through a running server: SemEval STS 2016's
five test sets (1,186 scored pairs: MTEB's STS16), Spearman's correlation of the cosine of
each pair's embeddings with its human score, for sentence-transformers fp32 in this process
and for each config through `numaserve start` (numaserve.testing.Server); and each served
sentence's cosine to fp32's vector (the share at 0.99, the accuracy gate's bar, and the lowest).

The data is not in this repository and no hub is reachable from here: pass the directory
that holds the five `*.test.tsv` files (score TAB sentence TAB sentence; the score is empty
where a pair was not scored, and such pairs are left out), e.g. data/sts/semeval-sts/2016 of
github.com/brmson/dataset-sts. Reported per set and over all pairs at once (as MTEB does).

Configs: `default` (the bundled MiniLM, `quantize: auto`: what it chooses on this CPU) and
`onnxruntime int8`; every server runs 2 instances x 1 core with the cache off.

Run:  .venv/bin/python -m benchmarks.sts DIR [--configs default,"onnxruntime int8"]
          [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import Client
from numaserve.host.topology import read_topology
from numaserve.status.report import RunningPath
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """\
model: {{path: bundled:minilm, task: embed{precision}}}
placement: {{pools: [{{name: all, max_tokens: 256, cores_per_instance: 1}}]}}
server: {{endpoint: "{endpoint}", cache_entries: 0}}
"""
SYSTEMS = {"default": "", "onnxruntime int8": ", backend: onnxruntime, quantize: int8"}
BATCH = 32  # texts a request


def read_sets(directory: Path) -> dict[str, list[tuple[float, str, str]]]:
    """Each test set's scored pairs, by the file's name."""
    sets = {}
    for path in sorted(directory.glob("*.test.tsv")):
        pairs = []
        for line in path.read_text(encoding="utf-8").splitlines():
            score, a, b = [*line.split("\t"), "", ""][:3]
            if score.strip():
                pairs.append((float(score), a, b))
        sets[path.name.removesuffix(".test.tsv")] = pairs
    if not sets:
        raise SystemExit(f"no *.test.tsv in {directory}")
    return sets


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def spearman(sets: dict, embed) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Spearman x 100 of cosine against the gold score, per set and over `all` pairs; and
    each sentence's vector, by its text."""
    out, gold_all, cos_all, vectors = {}, [], [], {}
    for name, pairs in sets.items():
        gold = [p[0] for p in pairs]
        left, right = embed([p[1] for p in pairs]), embed([p[2] for p in pairs])
        vectors |= dict(zip([p[1] for p in pairs], left, strict=True))
        vectors |= dict(zip([p[2] for p in pairs], right, strict=True))
        cos = cosines(left, right)
        out[name] = round(100 * spearmanr(cos, gold).statistic, 2)
        gold_all += gold
        cos_all += list(cos)
    out["all"] = round(100 * spearmanr(cos_all, gold_all).statistic, 2)
    return out, vectors


def agreement(vectors: dict, fp32: dict) -> dict:
    """Each sentence's cosine to fp32's vector: the share at the gate's 0.99, and the lowest."""
    texts = sorted(fp32)
    found = cosines(np.stack([vectors[t] for t in texts]), np.stack([fp32[t] for t in texts]))
    return {
        "sentences": len(texts),
        "share_0.99": round(float(np.mean(found >= 0.99)), 4),
        "lowest": round(float(found.min()), 4),
    }


def reference(sets: dict) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(resolve_model_path("bundled:minilm"), device="cpu")
    return spearman(sets, lambda texts: model.encode(texts, batch_size=BATCH))


def held(running: RunningPath) -> str:
    """Every path an instance holds, its own last."""
    pool = running.runs
    words = []
    for last, from_batch, path, _ in pool.by_band:
        where = "beyond" if last is None else f"up to {last} tokens"
        if from_batch > 1:
            words.append(f"{path} from {from_batch} a pass")
        else:
            words.append(f"{path} {where}" if pool.shorter else str(path))
    return ", ".join(words)


def served(name: str, sets: dict, work: Path) -> tuple[tuple[dict, dict], list[str]]:
    config = CONFIG.format(precision=SYSTEMS[name], endpoint=ENDPOINT)
    work.mkdir(parents=True)
    server = Server(work, config, name=name.replace(" ", "-"))
    try:
        ready = server.wait_ready(timeout=900)
        paths = sorted({held(RunningPath.from_wire(i["model_path"])) for i in ready.values()})

        def embed(texts: list[str]) -> np.ndarray:
            with Client(server.endpoint, timeout=60) as client:
                vectors = []
                for start in range(0, len(texts), BATCH):
                    vectors += [e.vector for e in client.embed(texts[start : start + BATCH])]
            return np.stack(vectors)

        return spearman(sets, embed), paths
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the five *.test.tsv files")
    parser.add_argument("--configs", default="default,onnxruntime int8")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sets = read_sets(args.directory)
    isa = read_topology().isa
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((li.split(":", 1)[1].strip() for li in cpuinfo if "model name" in li), "unknown")
    print(f"CPU: {cpu}; ISA: {' '.join(isa)}")
    print(f"pairs: {sum(map(len, sets.values()))} ({', '.join(sets)})")
    scores, fp32_vectors = reference(sets)
    results = {"sentence-transformers fp32": {"spearman": scores, "paths": ["fp32"]}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            (scores, vectors), paths = served(name, sets, Path(tmp) / name.replace(" ", "-"))
            results[name] = {
                "spearman": scores,
                "paths": paths,
                "to_fp32": agreement(vectors, fp32_vectors),
            }
    fp32 = results["sentence-transformers fp32"]["spearman"]["all"]
    print(f"{'system':28} {'path':24} {'all':>6} {'vs fp32':>8}  per set")
    for name, r in results.items():
        s = r["spearman"]
        per_set = "  ".join(f"{k} {v}" for k, v in s.items() if k != "all")
        print(
            f"{name:28} {', '.join(r['paths']):24} {s['all']:6.2f} {s['all'] - fp32:+8.2f}  {per_set}"
        )
    for name, r in results.items():
        if "to_fp32" in r:
            a = r["to_fp32"]
            print(
                f"{name}: {a['share_0.99']:.1%} of {a['sentences']} sentences at cosine >= 0.99 "
                f"to fp32, lowest {a['lowest']}"
            )
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "isa": isa, **results}, indent=1))


if __name__ == "__main__":
    main()
