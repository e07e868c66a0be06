"""int8 against fp32 for rerank and ner, on models trained here from MiniLM's real weights.

There is no model hub here, and MiniLM (bundled) is the only pretrained encoder at hand, so
each task gets a MiniLM fine-tuned (fp32, a minute or two on 2 cores) on the stdlib's
docstring sentences (numaserve/corpus.py), saved with save_pretrained, then served
through numaserve's own code at fp32 and int8 on both backends:

  rerank  a cross-encoder trained (2 epochs) to score (sentence, sentence) 1 when both
          document the same area of the standard library (benchmarks/accuracy.py's six
          areas). Measured on held-out queries, each with 10 candidate documents of which one
          is of the query's area: how often int8 puts the same document first as torch fp32
          (argmax agreement), and Spearman's rank correlation of the 10 scores, averaged.
  ner     a token classifier trained (4 epochs) on labels a rule gives each word: CODE (has
          "_", "()" or a dot inside: os.path, __init__) or NUM (has a digit); MiniLM is
          uncased, so no rule on capitals. Measured on held-out sentences through the router's
          entity code (aggregation simple): entity F1 of each variant against torch fp32, and
          against the rule.

Run:  .venv/bin/python -m benchmarks.accuracy_tasks [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.accuracy import AREA_OF, VARIANTS
from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_sentences_by_module
from numaserve.host.topology import read_topology
from numaserve.tasks.entities import entities

NER_LABELS = ("O", "B-CODE", "I-CODE", "B-NUM", "I-NUM")
CANDIDATES = 10
RERANK_EPOCHS, NER_EPOCHS = 2, 4


def word_label(word: str) -> str:
    core = word.strip(".,;:!?\"'`")
    if "_" in core or "()" in core or re.search(r"\w\.\w", core):
        return "CODE"
    if any(c.isdigit() for c in core):
        return "NUM"
    return "O"


def rule_entities(text: str) -> set[tuple[int, int, str]]:
    found = set()
    for match in re.finditer(r"\S+", text):
        label = word_label(match.group())
        if label != "O":
            found.add((match.start(), match.end(), label))
    return found


def train(directory: Path, task: str, examples, epochs: int) -> float:
    """Fine-tune MiniLM for `task` on `examples`; seconds it took."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    started = time.perf_counter()
    base = resolve_model_path("bundled:minilm")
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(0)
    if task == "rerank":
        model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    else:
        model = AutoModelForTokenClassification.from_pretrained(
            base,
            num_labels=len(NER_LABELS),
            id2label=dict(enumerate(NER_LABELS)),
            label2id={label: i for i, label in enumerate(NER_LABELS)},
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 if task == "ner" else 5e-5)
    rng = random.Random(0)
    model.train()
    for _ in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order), 32):
            batch = [examples[i] for i in order[start : start + 32]]
            if task == "rerank":
                enc = tokenizer(
                    [a for a, _, _ in batch],
                    [b for _, b, _ in batch],
                    padding=True,
                    truncation=True,
                    max_length=128,
                    return_tensors="pt",
                )
                logits = model(**enc).logits[:, 0]
                target = torch.tensor([float(y) for _, _, y in batch])
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
            else:
                enc = tokenizer(
                    [t for t in batch],
                    padding=True,
                    truncation=True,
                    max_length=128,
                    return_tensors="pt",
                    return_offsets_mapping=True,
                )
                labels = token_labels(batch, enc)
                enc.pop("offset_mapping")
                loss = model(**enc, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return time.perf_counter() - started


def token_labels(texts: list[str], enc) -> torch.Tensor:
    """Each token's label from its word's: B- on a word's first token, I- on the rest; -100
    (ignored) on special and padding tokens."""
    out = torch.full(enc["input_ids"].shape, -100)
    for row, text in enumerate(texts):
        spans = [(m.start(), m.end(), word_label(m.group())) for m in re.finditer(r"\S+", text)]
        seen = set()
        for col, (start, end) in enumerate(enc["offset_mapping"][row].tolist()):
            if start == end:
                continue
            word = next(i for i, (s, e, _) in enumerate(spans) if s <= start < e)
            label = spans[word][2]
            if label == "O":
                out[row, col] = 0
            else:
                out[row, col] = NER_LABELS.index(("I-" if word in seen else "B-") + label)
            seen.add(word)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def backend_variants(directory: Path, task: str) -> dict[str, ModelConfig]:
    """torch and onnxruntime, fp32 and int8; the first is the reference."""
    return {
        f"{backend} {quantize}": ModelConfig(
            path=str(directory), task=task, backend=backend, quantize=quantize, max_length=128
        )
        for backend, quantize in VARIANTS
    }


def rerank_table(directory: Path, queries, isa, variants: dict[str, ModelConfig]) -> dict:
    """Each variant's top-1 agreement and Spearman against the first variant's scores."""
    tokenizer = Tokenizer(str(directory), 128)
    scores = {}
    for name, config in variants.items():
        model = load_model(config, isa=isa)
        per_query = []
        for query, documents in queries:
            encoded = tokenizer.encode([(query, d) for d in documents])
            per_query.append(
                np.array(model.run([list(e.ids) for e in encoded], [e.second for e in encoded]))
            )
        scores[name] = per_query
    reference = next(iter(scores.values()))
    table = {}
    for name, runs in scores.items():
        top = np.mean([r.argmax() == f.argmax() for r, f in zip(runs, reference, strict=True)])
        rho = np.mean([spearman(r, f) for r, f in zip(runs, reference, strict=True)])
        table[name] = {"top1_agreement": float(top), "spearman": rho}
    return table


def ner_table(directory: Path, texts: list[str], isa, variants: dict[str, ModelConfig]) -> dict:
    """Each variant's entity F1 against the first variant's entities, and against the rule."""
    tokenizer = Tokenizer(str(directory), 128)
    encoded = tokenizer.encode_tagged(texts)
    found = {}
    for name, config in variants.items():
        model = load_model(config, isa=isa)
        found[name] = [
            {
                (e["start"], e["end"], e["label"])
                for e in entities(
                    text,
                    enc.tokens,
                    model.run([list(enc.ids)])[0],
                    model.labels,
                    "simple",
                    tokenizer.word_aware,
                )
            }
            for text, enc in zip(texts, encoded, strict=True)
        ]
    reference = next(iter(found.values()))
    truth = [rule_entities(t) for t in texts]

    def micro_f1(runs, against) -> float:
        hits = sum(len(a & b) for a, b in zip(runs, against, strict=True))
        total = sum(len(a) + len(b) for a, b in zip(runs, against, strict=True))
        return 2 * hits / total if total else 1.0

    return {
        name: {"f1_vs_fp32": micro_f1(runs, reference), "f1_vs_rule": micro_f1(runs, truth)}
        for name, runs in found.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    isa = read_topology().isa
    data = TaskData.build()
    print(
        f"corpus: {data.size} stdlib docstring sentences; ISA {' '.join(isa)}; torch {torch.__version__}"
    )
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        rerank_dir, ner_dir = Path(tmp) / "rerank", Path(tmp) / "ner"
        seconds = train(rerank_dir, "rerank", data.pairs, epochs=RERANK_EPOCHS)
        results["rerank"] = rerank_table(
            rerank_dir, data.queries, isa, backend_variants(rerank_dir, "rerank")
        )
        print(
            f"\nrerank: MiniLM cross-encoder, {len(data.pairs)} pairs, {RERANK_EPOCHS} epochs "
            f"({seconds:.0f} s); {len(data.queries)} held-out queries x {CANDIDATES} documents"
        )
        print_rerank(results["rerank"])
        seconds = train(ner_dir, "ner", data.ner_train, epochs=NER_EPOCHS)
        results["ner"] = ner_table(ner_dir, data.ner_test, isa, backend_variants(ner_dir, "ner"))
        print(
            f"\nner: MiniLM token classifier, {len(data.ner_train)} sentences, {NER_EPOCHS} "
            f"epochs ({seconds:.0f} s); {len(data.ner_test)} held-out sentences, aggregation simple"
        )
        print_ner(results["ner"])
    if args.json:
        args.json.write_text(json.dumps({"isa": list(isa), **results}, indent=1))


def print_rerank(table: dict, extra: dict | None = None) -> None:
    print(
        f"{'variant':<32}{'top-1 agreement':>18}{'Spearman':>10}" + ("  ms a pair" if extra else "")
    )
    for name, row in table.items():
        tail = f"{extra[name]:>11.2f}" if extra else ""
        print(f"{name:<32}{row['top1_agreement']:>18.2%}{row['spearman']:>10.4f}{tail}")


def print_ner(table: dict, extra: dict | None = None) -> None:
    print(
        f"{'variant':<32}{'entity F1 vs fp32':>20}{'vs the rule':>14}"
        + ("  ms a text" if extra else "")
    )
    for name, row in table.items():
        tail = f"{extra[name]:>11.2f}" if extra else ""
        print(f"{name:<32}{row['f1_vs_fp32']:>20.2%}{row['f1_vs_rule']:>14.2%}{tail}")


@dataclass
class TaskData:
    """The stdlib sentences, cut into each task's training and held-out sets."""

    size: int
    pairs: list[tuple[str, str, int]]
    queries: list[tuple[str, list[str]]]
    ner_train: list[str]
    ner_test: list[str]

    @classmethod
    def build(cls) -> TaskData:
        corpus = [(AREA_OF[m], s) for m, s in stdlib_sentences_by_module() if m in AREA_OF]
        rng = random.Random(0)
        train_half, held_out = corpus[0::2], corpus[1::2]
        pairs = []
        for area, sentence in train_half:
            same = [s for a, s in train_half if a == area and s != sentence]
            other = [s for a, s in train_half if a != area]
            pairs += [(sentence, rng.choice(same), 1), (sentence, rng.choice(other), 0)]
        queries = []
        for area, sentence in rng.sample(held_out, 200):
            same = [s for a, s in held_out if a == area and s != sentence]
            other = [s for a, s in held_out if a != area]
            queries.append((sentence, rng.sample(same, 1) + rng.sample(other, CANDIDATES - 1)))
        sentences = [s for _, s in corpus]
        return cls(len(corpus), pairs, queries, sentences[0::2], sentences[1::2])


if __name__ == "__main__":
    main()
