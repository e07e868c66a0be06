"""int8 against fp32 for rerank and ner, on models trained here from MiniLM's real weights.

There is no model hub here, and MiniLM (bundled) is the only pretrained encoder at hand, so
each task gets a MiniLM fine-tuned (fp32, a minute or two on 2 cores) on the stdlib's
docstring sentences (numaserve/loadgen/corpus.py), saved with save_pretrained, then served
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

Run:  .venv/bin/python benchmarks/accuracy_tasks.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.accuracy import AREA_OF, VARIANTS
from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.config import ModelConfig
from numaserve.host.topology import read_topology
from numaserve.loadgen.corpus import stdlib_sentences_by_module
from numaserve.modelpath import resolve_model_path
from numaserve.router.entities import entities

NER_LABELS = ("O", "B-CODE", "I-CODE", "B-NUM", "I-NUM")
CANDIDATES = 10


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


def rerank_table(directory: Path, queries, isa) -> dict:
    tokenizer = Tokenizer(str(directory), 128)
    scores = {}
    for backend, quantize in VARIANTS:
        config = ModelConfig(
            path=str(directory), task="rerank", backend=backend, quantize=quantize, max_length=128
        )
        model = load_model(config, isa=isa)
        per_query = []
        for query, documents in queries:
            encoded = tokenizer.encode([(query, d) for d in documents])
            per_query.append(
                np.array(model.run([list(e.ids) for e in encoded], [e.second for e in encoded]))
            )
        scores[backend, quantize] = per_query
    reference = scores["torch", "none"]
    table = {}
    for variant, runs in scores.items():
        top = np.mean([r.argmax() == f.argmax() for r, f in zip(runs, reference, strict=True)])
        rho = np.mean([spearman(r, f) for r, f in zip(runs, reference, strict=True)])
        table[" ".join(variant)] = {"top1_agreement": float(top), "spearman": rho}
    return table


def ner_table(directory: Path, texts: list[str], isa) -> dict:
    tokenizer = Tokenizer(str(directory), 128)
    encoded = tokenizer.encode_tagged(texts)
    found = {}
    for backend, quantize in VARIANTS:
        config = ModelConfig(
            path=str(directory), task="ner", backend=backend, quantize=quantize, max_length=128
        )
        model = load_model(config, isa=isa)
        found[backend, quantize] = [
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
    reference = found["torch", "none"]
    truth = [rule_entities(t) for t in texts]

    def micro_f1(runs, against) -> float:
        hits = sum(len(a & b) for a, b in zip(runs, against, strict=True))
        total = sum(len(a) + len(b) for a, b in zip(runs, against, strict=True))
        return 2 * hits / total if total else 1.0

    return {
        " ".join(variant): {
            "f1_vs_fp32": micro_f1(runs, reference),
            "f1_vs_rule": micro_f1(runs, truth),
        }
        for variant, runs in found.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    isa = read_topology().isa
    corpus = [(AREA_OF[m], s) for m, s in stdlib_sentences_by_module() if m in AREA_OF]
    print(
        f"corpus: {len(corpus)} stdlib docstring sentences; ISA {' '.join(isa)}; torch {torch.__version__}"
    )
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
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        rerank_dir, ner_dir = Path(tmp) / "rerank", Path(tmp) / "ner"
        seconds = train(rerank_dir, "rerank", pairs, epochs=2)
        results["rerank"] = rerank_table(rerank_dir, queries, isa)
        print(
            f"\nrerank: MiniLM cross-encoder, {len(pairs)} pairs, 2 epochs ({seconds:.0f} s); "
            f"{len(queries)} held-out queries x {CANDIDATES} documents"
        )
        print(f"{'variant':<24}{'top-1 agreement':>18}{'Spearman':>10}")
        for variant, row in results["rerank"].items():
            print(f"{variant:<24}{row['top1_agreement']:>18.2%}{row['spearman']:>10.4f}")
        sentences = [s for _, s in corpus]
        seconds = train(ner_dir, "ner", sentences[0::2], epochs=4)
        results["ner"] = ner_table(ner_dir, sentences[1::2], isa)
        print(
            f"\nner: MiniLM token classifier, {len(sentences[0::2])} sentences, 4 epochs "
            f"({seconds:.0f} s); {len(sentences[1::2])} held-out sentences, aggregation simple"
        )
        print(f"{'variant':<24}{'entity F1 vs fp32':>20}{'vs the rule':>14}")
        for variant, row in results["ner"].items():
            print(f"{variant:<24}{row['f1_vs_fp32']:>20.2%}{row['f1_vs_rule']:>14.2%}")
    if args.json:
        args.json.write_text(json.dumps({"isa": list(isa), **results}, indent=1))


if __name__ == "__main__":
    main()
