"""The embedding architectures of 2026 at their published layer shapes: which path
`quantize: auto` chooses for each on this CPU, and how fast it runs against
sentence-transformers' own `encode` (torch) on the same core.

Each model is made here with random weights (seed 0) in its published shape (layers, width,
heads, feed-forward), over MiniLM's vocabulary and tokenizer (30,522 tokens: the published
vocabularies are larger, which changes the embedding table, not the work per token), saved as
sentence-transformers saves the published checkpoint (its pooling, EmbeddingGemma's two Dense
projections, Normalize). On one pinned core, one thread, one text at a time: `load_model` with
`quantize: auto` (the race and the gate, as a first start runs them), then the chosen path and
`SentenceTransformer.encode` in turns, round after round, on short texts (the shipped queries
and titles) and long ones (runs of docstring passages, about 250 tokens). Reported: the
choice, ms a text for each side, and their ratio (median over the rounds, and the range).
The first run chooses (minutes a model); later runs reuse the choice from the cache.

With `--st-onnx PYTHON` and `--st-openvino PYTHON` (the Pythons of .peers/st-onnx and
.peers/st-openvino: benchmarks/peer_apps/install.sh), more sides in the same turns:
sentence-transformers' own fastest CPU paths, its ONNX backend with the int8 model its
`export_dynamic_quantized_onnx_model` makes for this CPU and its OpenVINO backend with the
int8 model its `export_static_quantized_openvino_model` calibrates, and each one's fp32
export, on the same core (benchmarks/peer_apps/st_backend.py), with each int8's cosine to its
own fp32; a model a backend cannot export or run is reported so.

Run:  .venv/bin/python -m benchmarks.embedders [--models gte,qwen3] [--rounds 3] [--cpu 1]
          [--st-onnx .peers/st-onnx/bin/python] [--st-openvino .peers/st-openvino/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks import machine

# Published shapes: (transformers config class, its arguments, pooling, Dense projections).
SHAPES = {
    "nomic_bert": (  # nomic-embed-text-v1.5
        "NomicBertConfig",
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "mean",
        (),
    ),
    "gte": (  # gte-base-en-v1.5
        "GteConfig",
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "cls",
        (),
    ),
    "jina_embeddings_v3": (  # jina-embeddings-v3 (XLM-RoBERTa large)
        "JinaEmbeddingsV3Config",
        dict(
            hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
        ),
        "mean",
        (),
    ),
    "eurobert": (  # EuroBERT-210m
        "EuroBertConfig",
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=12,
            intermediate_size=3072,
        ),
        "mean",
        (),
    ),
    "qwen3": (  # Qwen3-Embedding-0.6B
        "Qwen3Config",
        dict(
            hidden_size=1024,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
        ),
        "lasttoken",
        (),
    ),
    "gemma3_text": (  # EmbeddingGemma-300m
        "Gemma3TextConfig",
        dict(
            hidden_size=768,
            num_hidden_layers=24,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=256,
            intermediate_size=1152,
            use_bidirectional_attention=True,
            sliding_window=512,
        ),
        "mean",
        ((3072, False), (768, False)),
    ),
}
TOKENS = dict(vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102)


def save(name: str, path: Path) -> Path:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer, models

    from numaserve.checkpoint.paths import resolve_model_path

    config_class, shape, pooling, dense = SHAPES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**shape, **TOKENS, max_position_embeddings=512)
    transformers.AutoModel.from_config(config).save_pretrained(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm"))
    tokenizer.save_pretrained(path)
    width = shape["hidden_size"]
    modules = [models.Transformer(str(path), max_seq_length=512)]
    modules.append(models.Pooling(width, pooling_mode=pooling))
    for out, bias in dense:
        identity = torch.nn.Identity()
        modules.append(models.Dense(width, out, bias=bias, activation_function=identity))
        width = out
    modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    return path


def texts() -> dict[str, list[str]]:
    from numaserve.corpus import short_texts, stdlib_passages

    passages = stdlib_passages()
    long = [" ".join(passages[i : i + 6])[:1400] for i in range(0, 72, 6)]
    return {"short": list(short_texts()[:60]), "long": long}


def one_by_one(encode, batch: list[str]) -> float:
    started = time.perf_counter()
    for text in batch:
        encode(text)
    return (time.perf_counter() - started) * 1000 / len(batch)


class StBackend:
    """A sentence-transformers backend in its own venv and process (peer_apps/st_backend.py)."""

    def __init__(
        self, python: str, backend: str, cpu: int, path: Path, probe: list[str], timed: str
    ) -> None:
        script = Path(__file__).with_name("peer_apps") / "st_backend.py"
        self.child = subprocess.Popen(
            [python, str(script), backend, str(cpu), str(path), timed],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.said = self.ask(probe)

    def ask(self, texts: list[str]) -> str:
        self.child.stdin.write(json.dumps(texts) + "\n")
        self.child.stdin.flush()
        return self.child.stdout.readline().strip()

    def ms_a_text(self, batch: list[str]) -> float:
        return float(self.ask(batch))

    def close(self) -> None:
        self.child.kill()
        self.child.wait()


def measure(name: str, directory: Path, rounds: int, cpu: int, peers: dict[str, str]) -> dict:
    """`peers`: the Python of each sentence-transformers backend to time beside, by name."""
    import torch
    from sentence_transformers import SentenceTransformer

    from numaserve.backends import load_model
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.config.schema import ModelConfig
    from numaserve.host.topology import read_topology

    path = save(name, directory / name)
    isa = read_topology().isa
    config = ModelConfig(path=str(path), task="embed", max_length=512)
    started = time.monotonic()
    ours = load_model(config, isa, 1)
    chose_s = time.monotonic() - started
    tokenizer = Tokenizer(str(path), 512)
    torch.set_num_threads(1)
    theirs = SentenceTransformer(str(path), device="cpu")
    sides = {  # each: a batch's ms a text
        "numaserve": lambda b: one_by_one(
            lambda t: ours.run([list(tokenizer.encode([t])[0].ids)]), b
        ),
        "sentence-transformers": lambda b: one_by_one(lambda t: theirs.encode([t]), b),
    }
    result = {"choice": str(ours.choice.path), "choice_s": round(chose_s, 1)}
    started_peers = []
    probe = [t for batch in texts().values() for t in batch]
    for backend, python in peers.items():
        for timed in ("int8", "fp32"):
            peer = StBackend(python, backend, cpu, path, probe, timed)
            started_peers.append(peer)
            result[f"st_{backend}"] = peer.said
            if not peer.said.startswith("ready"):
                break  # it cannot export the model, or ST cannot run its export: said once
            sides[f"st-{backend}-{timed}"] = peer.ms_a_text
    try:
        for kind, batch in texts().items():
            for run in sides.values():  # warm each
                run(batch[:3])
            times: dict[str, list[float]] = {side: [] for side in sides}
            for r in range(rounds):
                for side in list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]:
                    times[side].append(sides[side](batch))
            tokens = statistics.mean(len(e.ids) for e in tokenizer.encode(batch))
            result[kind] = {
                "tokens": round(tokens),
                **{f"{side}_ms": round(statistics.median(v), 2) for side, v in times.items()},
            }
            for side in sides:
                if side != "numaserve":
                    ratios = [a / b for a, b in zip(times[side], times["numaserve"], strict=True)]
                    key = "speedup" if side == "sentence-transformers" else f"over_{side}"
                    result[kind][key] = round(statistics.median(ratios), 2)
                    result[kind][f"{key}_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
    finally:
        for peer in started_peers:
            peer.close()
    print(name, json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/embedders.json")
    parser.add_argument("--st-onnx", help="the Python of .peers/st-onnx (install.sh)")
    parser.add_argument("--st-openvino", help="the Python of .peers/st-openvino (install.sh)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})  # before any runtime starts its threads
    topology = machine.topology()
    warnings.simplefilter("ignore")
    results = {"topology": topology, "cpu": args.cpu, "rounds": args.rounds, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            peers = {"onnx": args.st_onnx, "openvino": args.st_openvino}
            peers = {backend: python for backend, python in peers.items() if python}
            results["models"][name] = measure(name, Path(tmp), args.rounds, args.cpu, peers)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
