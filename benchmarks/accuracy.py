"""int8 against fp32 on real sentences: the first sentences of the stdlib's docstrings.

Embeddings: bundled MiniLM, cosine between int8 and fp32 for every sentence, for torch's
default int8 (per-tensor, 7-bit activations) and for numaserve's (per-channel weights, 8-bit
activations; 7-bit weights where the CPU lacks VNNI/AMX, which cannot saturate fbgemm's AVX2
kernels, so the figure is the same on either kind of CPU), and for the ONNX Runtime backend's
int8 (the default backend).

Classification: a real classifier, MiniLM fine-tuned here (fp32) to tell which area of the
standard library a sentence documents, saved with save_pretrained, then loaded through
numaserve at fp32 and at int8, on both backends. Reported: argmax agreement with torch fp32 on
every sentence, and each one's accuracy on the held-out half.

Run:  .venv/bin/python -m benchmarks.accuracy [--epochs 3]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from numaserve.backends import load_model
from numaserve.backends.base import Load, full_range_int8
from numaserve.backends.tokenizer import Tokenizer
from numaserve.backends.torch import TorchModel, quantize_int8
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_sentences_by_module
from numaserve.host.topology import read_topology

AREAS = {
    "text": "re string textwrap difflib shlex tokenize pprint html.parser",
    "data formats": "json csv pickle base64 configparser tarfile zipfile gzip wave xml.dom.minidom mimetypes",
    "network and mail": "socket ssl http.client http.cookies urllib.parse urllib.request smtplib imaplib poplib email.message email.utils mailbox ipaddress",
    "files and processes": "os pathlib shutil tempfile subprocess platform",
    "numbers and time": "math decimal fractions statistics random datetime calendar time uuid hashlib",
    "runtime": "asyncio threading queue logging warnings traceback unittest inspect argparse functools itertools collections heapq sqlite3",
}
VARIANTS = [("torch", "none"), ("torch", "int8"), ("onnxruntime", "none"), ("onnxruntime", "int8")]
AREA_OF = {m: area for area, mods in AREAS.items() for m in mods.split()}
LABELS = list(AREAS)


def embedding_table(texts, tokenizer, isa) -> list[tuple[str, np.ndarray]]:
    fp32 = TorchModel(Load(ModelConfig(quantize="none")))
    ids = [list(e.ids) for e in tokenizer.encode(texts)]

    def embed(module):
        fp32_module, fp32.module = fp32.module, module
        out = np.stack([fp32.run([x])[0] for x in ids])
        fp32.module = fp32_module
        return out

    reference = embed(fp32.module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_default = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(fp32.module), {torch.nn.Linear}, dtype=torch.qint8
        )
    variants = [
        ("torch default: per-tensor, 7-bit activations", torch_default),
        (
            "numaserve without VNNI: 7-bit weights, 8-bit act.",
            quantize_int8(copy.deepcopy(fp32.module), False),
        ),
    ]
    if full_range_int8(isa):
        variants.append(
            (
                "numaserve with VNNI/AMX: per-channel, 8-bit",
                quantize_int8(copy.deepcopy(fp32.module), True),
            )
        )
    table = [(name, (embed(m) * reference).sum(axis=1)) for name, m in variants]
    onnx = load_model(ModelConfig(backend="onnxruntime"), isa)
    table.append(
        (
            "onnxruntime int8: per-channel (numaserve's)",
            (np.stack([onnx.run([x])[0] for x in ids]) * reference).sum(axis=1),
        )
    )
    return table


def train_classifier(pairs, directory: Path, epochs: int) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm"))
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_model_path("bundled:minilm"),
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(epochs):
        order = rng.permutation(len(pairs))
        for start in range(0, len(order), 32):
            batch = [pairs[i] for i in order[start : start + 32]]
            enc = tokenizer([t for t, _ in batch], padding=True, return_tensors="pt")
            loss = model(**enc, labels=torch.tensor([y for _, y in batch])).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    isa = read_topology().isa
    corpus = stdlib_sentences_by_module()
    texts = [s for _, s in corpus]
    tokenizer = Tokenizer("bundled:minilm", max_length=256)
    print(
        f"corpus: {len(texts)} first sentences of stdlib docstrings (Python {sys.version.split()[0]})"
    )
    print(f"CPU ISA: {' '.join(isa)}; torch {torch.__version__}\n")

    print("Embeddings, bundled:minilm: cosine(int8, fp32)")
    print(f"{'int8 variant':<48}{'mean':>8}{'worst':>8}{'p1':>8}")
    for name, cosine in embedding_table(texts, tokenizer, isa):
        print(
            f"{name:<48}{cosine.mean():>8.4f}{cosine.min():>8.4f}{np.percentile(cosine, 1):>8.4f}"
        )

    labelled = [(s, LABELS.index(AREA_OF[m])) for m, s in corpus]
    train, held_out = labelled[0::2], labelled[1::2]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        train_classifier(train, Path(tmp), args.epochs)
        trained_in = time.perf_counter() - started
        ids = [list(e.ids) for e in tokenizer.encode(texts)]
        predictions = {}
        for backend, quantize in VARIANTS:
            config = ModelConfig(path=tmp, task="classify", backend=backend, quantize=quantize)
            model = load_model(config, isa=isa)
            predictions[backend, quantize] = [model.run([x])[0].label for x in ids]
    truth = {s: LABELS[y] for s, y in held_out}
    held = [i for i, t in enumerate(texts) if t in truth]

    def agree(variant):
        pairs = zip(predictions["torch", "none"], predictions[variant], strict=True)
        return np.mean([a == b for a, b in pairs])

    def accuracy(variant):
        return np.mean([predictions[variant][i] == truth[texts[i]] for i in held])

    print(
        f"\nClassifier: MiniLM fine-tuned {args.epochs} epochs on {len(train)} sentences "
        f"({trained_in:.0f} s), {len(LABELS)} areas of the stdlib"
    )
    print(f"{'variant':<24}{'agreement with torch fp32':>27}{'held-out accuracy':>19}")
    for variant in VARIANTS:
        print(f"{' '.join(variant):<24}{agree(variant):>27.2%}{accuracy(variant):>19.2%}")
    print(f"(agreement: all {len(texts)} sentences; held-out: {len(held)})")


if __name__ == "__main__":
    main()
