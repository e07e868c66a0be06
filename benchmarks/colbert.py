"""Late interaction (ColBERT) through the server, against sentence-transformers'
MultiVectorEncoder in one process on the same cores, and PyLate's own encode.

A ColBERT of a published shape (random weights, seed 0, over MiniLM's vocabulary), saved as
MultiVectorEncoder saves it (query expansion fixed at 32, a Dense projection without bias,
Normalize, the punctuation skiplist, prompts "[Q] " and "[D] "), served by `numaserve start`
with `quantize: auto` over every core, its cache off (a cross-encoder's scores repeated would
come from it). Measured, the sides in turns, round after round:
- documents a second at saturation: clients sending 16 documents a request to the server,
  against `MultiVectorEncoder.encode_document` (batch 32, torch with a thread a core) and
  PyLate's `ColBERT.encode(is_query=False)` (the same backbone and projection width, batch 32,
  its own environment: benchmarks/peer_apps/install.sh);
- one document at a time: ms a document, one client, against `encode_document([doc])`;
- reranking 100 documents of about 200 tokens for a query, ms a query: by MaxSim on this
  server, against a cross-encoder of the same backbone served on the model path auto chose
  for the ColBERT; and by MaxSim with the documents' vectors stored beforehand (the query's
  vectors from the server, MaxSim in numpy);
- a 1,000-document /embed_all: its reply's bytes and time, as float32 numbers, int8 and
  binary, as numbers and in base64.

Run:  .venv/bin/python -m benchmarks.colbert [--shape answerai-small] [--rounds 3] [--seconds 20]
          [--clients 8] [--pylate .peers/pylate/bin/python]
"""

from __future__ import annotations

import argparse
import json
import statistics
import string
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import machine
from numaserve.testing.server import Server

# name: (layers, width, heads, feed-forward, projection, document length)
SHAPES = {
    "answerai-small": (12, 384, 12, 1536, 96, 300),  # answerai-colbert-small-v1
    "colbert-v2": (12, 768, 12, 3072, 128, 180),  # colbert-ir/colbertv2.0
    "tiny": (2, 64, 2, 128, 48, 180),  # to check the script itself in a minute
}
PER_REQUEST = 16
CONFIG = """
model: {{path: "{path}", task: {task}, max_length: {length}{precision}}}
server: {{endpoint: "@ENDPOINT@", cache_entries: 0}}
"""
PYLATE = ".peers/pylate/bin/python"


def save_colbert(shape: str, path: Path) -> Path:
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    backbone(shape, path)
    _, width, _, _, out, length = SHAPES[shape]
    expansion = {"strategy": "fixed", "length": 32}
    transformer = Transformer(str(path), document_length=length, query_expansion=expansion)
    dense = Dense(
        width,
        out,
        bias=False,
        activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings",
        module_output_name="token_embeddings",
    )
    modules = [
        transformer,
        dense,
        Normalize(module_input_name="token_embeddings"),
        MultiVectorMask(list(string.punctuation)),
    ]
    prompts = {"query": "[Q] ", "document": "[D] "}
    MultiVectorEncoder(modules=modules, prompts=prompts, device="cpu").save(str(path))
    return path


def save_cross_encoder(shape: str, path: Path) -> Path:
    """The same backbone with one score, as sentence-transformers' CrossEncoder saves it."""
    from sentence_transformers import CrossEncoder

    backbone(shape, path, labels=1)
    CrossEncoder(str(path), num_labels=1, device="cpu", max_length=512).save(str(path))
    return path


def backbone(shape: str, path: Path, labels: int | None = None) -> None:
    import torch
    from transformers import (
        AutoModel,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        BertConfig,
    )

    from numaserve.checkpoint.paths import resolve_model_path

    layers, width, heads, ffn, _, _ = SHAPES[shape]
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, num_labels=labels or 2,
    )  # fmt: skip
    loader = AutoModelForSequenceClassification if labels else AutoModel
    loader.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)


def documents(count: int) -> list[str]:
    """Passages of about 200 tokens."""
    from numaserve.corpus import stdlib_passages

    passages = stdlib_passages()
    return [
        " ".join(passages[(i + k) % len(passages)] for k in range(3))[:900] for i in range(count)
    ]


def served_rate(endpoint: str, docs: list[str], clients: int, seconds: float) -> float:
    """Documents a second, `clients` clients each sending PER_REQUEST a request."""
    from numaserve.client import Client

    done = [0] * clients
    stop = time.monotonic() + seconds

    def load(i: int) -> None:
        with Client(endpoint, timeout=120) as client:
            while time.monotonic() < stop:
                start = (done[i] * PER_REQUEST + i * 97) % (len(docs) - PER_REQUEST)
                client.embed_multi(docs[start : start + PER_REQUEST])
                done[i] += 1

    began = time.monotonic()
    threads = [threading.Thread(target=load, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) * PER_REQUEST / (time.monotonic() - began)


def local_rate(model, docs: list[str], seconds: float) -> float:
    count, began = 0, time.monotonic()
    while time.monotonic() - began < seconds:
        start = (count * 32) % (len(docs) - 32)
        model.encode_document(docs[start : start + 32], batch_size=32)
        count += 32
    return count / (time.monotonic() - began)


def pylate_rate(python: str, backbone_path: Path, shape: str, docs: list[str], seconds: float):
    """PyLate's documents a second, in its own environment (benchmarks/peer_apps)."""
    _, _, _, _, dim, length = SHAPES[shape]
    asked = {"backbone": str(backbone_path), "dim": dim, "document_length": length}
    out = subprocess.run(
        [python, str(Path(__file__).parent / "peer_apps/pylate_encode.py")],
        input=json.dumps({**asked, "documents": docs, "seconds": seconds}),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)["documents_a_second"]


def single_ms(encode, docs: list[str], times: int) -> float:
    """Median ms for one document at a time."""
    spent = []
    for i in range(times):
        began = time.perf_counter()
        encode(docs[i % len(docs)])
        spent.append(time.perf_counter() - began)
    return round(statistics.median(spent) * 1000, 2)


def rerank_ms(endpoint: str, query: str, docs: list[str], times: int) -> float:
    from numaserve.client import Client

    with Client(endpoint, timeout=120) as client:
        client.rerank(query, docs)  # warm
        spent = []
        for _ in range(times):
            began = time.perf_counter()
            client.rerank(query, docs)
            spent.append(time.perf_counter() - began)
    return round(statistics.median(spent) * 1000, 1)


def stored_maxsim_ms(endpoint: str, query: str, docs: list[str], times: int) -> float:
    """The documents' vectors stored beforehand, as an index keeps them: a query's cost is
    its own vectors from the server and MaxSim against each document's in numpy."""
    import numpy as np

    from numaserve.client import Client

    with Client(endpoint, timeout=120) as client:
        index = [d.vectors for d in client.embed_multi(docs)]
        spent = []
        for _ in range(times):
            began = time.perf_counter()
            q = client.embed_multi(query, prompt_name="query").vectors
            scores = [float((q @ d.T).max(axis=1).sum()) for d in index]
            np.argsort(scores)
            spent.append(time.perf_counter() - began)
    return round(statistics.median(spent) * 1000, 1)


def replies(url: str, docs: list[str]) -> dict:
    """A 1,000-document /embed_all in each stored type: its bytes and seconds."""
    import httpx

    out = {}
    with httpx.Client(base_url=url, timeout=600) as http:
        for kind in ("float", "int8", "binary"):
            for encoding in ("float", "base64"):
                body = {"inputs": docs, "embedding_type": kind, "encoding_format": encoding}
                began = time.perf_counter()
                reply = http.post("/embed_all", json=body)
                reply.raise_for_status()
                seconds = time.perf_counter() - began
                out[f"{kind}/{encoding}"] = {"bytes": len(reply.content), "s": round(seconds, 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="answerai-small", choices=SHAPES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pylate", default=PYLATE, help="the Python of PyLate's environment")
    parser.add_argument("--out", default="benchmarks/results/colbert.json")
    args = parser.parse_args()
    import os

    import torch

    result: dict = {"machine": machine.topology(), "shape": args.shape, "clients": args.clients}
    work = Path(tempfile.mkdtemp(prefix="colbert-bench-"))
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    colbert = save_colbert(args.shape, work / "colbert")
    backbone(args.shape, work / "backbone")  # PyLate builds its ColBERT on it
    query = "how does a module keep its state between calls?"
    path = served_colbert(args, colbert, work, query, result)
    ranker = save_cross_encoder(args.shape, work / "ranker")
    precision = f", backend: {path['backend']}, quantize: {path['quantize']}"
    config = CONFIG.format(path=ranker, task="rerank", length=512, precision=precision)
    (work / "ranker-served").mkdir()
    server = Server(work / "ranker-served", config)
    try:
        server.wait_ready(timeout=3600)
        docs = documents(100)
        result["rerank_100_ms"]["cross_encoder"] = rerank_ms(server.endpoint, query, docs, 10)
    finally:
        server.stop()
    save(args.out, result)
    print(json.dumps(result, indent=1))


def served_colbert(args, colbert: Path, work: Path, query: str, result: dict) -> dict:
    """The ColBERT's figures, kept in `result` as they come; the model path auto chose."""
    from sentence_transformers import MultiVectorEncoder

    from numaserve.client import Client

    docs = documents(2000)
    reference = MultiVectorEncoder(str(colbert), device="cpu")
    pylate = Path(args.pylate).exists()
    length = SHAPES[args.shape][5]
    (work / "served").mkdir()
    config = CONFIG.format(path=colbert, task="multivector", length=length, precision="")
    server = Server(work / "served", config)
    try:
        began = time.monotonic()
        server.wait_ready(timeout=3600)
        result["ready_s"] = round(time.monotonic() - began, 1)
        with Client(server.endpoint, timeout=120) as client:
            path = client.status()["instances"][0]["model_path"]["path"]
            result["model_path"] = path
            rates: dict[str, list[float]] = {"numaserve": [], "MultiVectorEncoder": []}
            singles: dict[str, list[float]] = {"numaserve": [], "MultiVectorEncoder": []}
            if pylate:
                rates["PyLate"] = []
            for _ in range(args.rounds):
                rate = served_rate(server.endpoint, docs, args.clients, args.seconds)
                rates["numaserve"].append(rate)
                rates["MultiVectorEncoder"].append(local_rate(reference, docs, args.seconds))
                if pylate:
                    backbone_path = work / "backbone"
                    rates["PyLate"].append(
                        pylate_rate(args.pylate, backbone_path, args.shape, docs, args.seconds)
                    )
                singles["numaserve"].append(single_ms(client.embed_multi, docs, 50))
                singles["MultiVectorEncoder"].append(
                    single_ms(lambda d: reference.encode_document([d]), docs, 50)
                )
                result["documents_a_second"] = {
                    k: [round(v, 1) for v in r] for k, r in rates.items()
                }
                result["one_document_ms"] = singles
                save(args.out, result)  # each round's figures kept as they come
        result["speedup"] = {
            peer: ratios(rates["numaserve"], rates[peer]) for peer in rates if peer != "numaserve"
        }
        result["one_document_speedup"] = ratios(singles["MultiVectorEncoder"], singles["numaserve"])
        result["rerank_100_ms"] = {
            "maxsim": rerank_ms(server.endpoint, query, docs[:100], 10),
            "maxsim_stored": stored_maxsim_ms(server.endpoint, query, docs[:100], 10),
        }
        result["replies_1000"] = replies(server.url, docs[:1000])
        save(args.out, result)
    finally:
        server.stop()
    return path


def ratios(ours: list[float], theirs: list[float]) -> dict:
    """Round by round ratios: their median and range."""
    each = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {
        "median": round(statistics.median(each), 2),
        "range": [round(min(each), 2), round(max(each), 2)],
    }


def save(path: str, result: dict) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
