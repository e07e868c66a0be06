"""Named entities from a token classifier's per-token probabilities: transformers'
token-classification pipeline (`aggregation_strategy` none, simple, first, average, max),
ported so that the router answers with the same entities and character offsets.

The worker sends each token's probabilities; the router, which has the text and the
tokenizer's offsets, turns them into entities. Each entity carries `text`, the span of the
original text, where the pipeline's `word` is the tokenizer's decoding of it (lowercased by
an uncased model).
"""

from __future__ import annotations

import numpy as np

from numaserve.tasks.tokens import Tokens

IGNORED = "O"  # the pipeline's ignore_labels: tokens outside any entity


def entities(
    text: str,
    tokens: Tokens,
    scores: np.ndarray,
    labels: tuple[str, ...],
    strategy: str,
    word_aware: bool,
) -> list[dict]:
    """The entities of `text`, from `scores` (one probability row per token).

    `word_aware`: the tokenizer marks a word's continuation pieces (WordPiece's "##"), so a
    piece is a subword exactly when its spelling is longer than its span; otherwise the
    pipeline's heuristic (no space before it) is used."""
    pre = []
    for index, row in enumerate(scores):
        if tokens.special[index]:
            continue
        start, end = tokens.offsets[index]
        piece = tokens.pieces[index]
        if tokens.unknown[index]:
            subword = False
        elif word_aware:
            subword = len(piece) != end - start
        else:
            subword = start > 0 and " " not in text[start - 1 : start + 1]
        pre.append({"scores": row, "start": start, "end": end, "index": index, "subword": subword})
    if strategy in ("none", "simple"):
        found = [_labelled(p["scores"], labels) | _span(p, p, index=p["index"]) for p in pre]
    else:
        found = _words(pre, labels, strategy)
    if strategy != "none":
        found = _grouped(found)
    return [
        {**entity, "text": text[entity["start"] : entity["end"]]}
        for entity in found
        if entity["label"] != IGNORED
    ]


def _labelled(row: np.ndarray, labels: tuple[str, ...]) -> dict:
    best = int(row.argmax())
    return {"label": labels[best], "score": float(row[best])}


def _span(first: dict, last: dict, **extra) -> dict:
    return {"start": first["start"], "end": last["end"], **extra}


def _words(pre: list[dict], labels: tuple[str, ...], strategy: str) -> list[dict]:
    """One entity per word (a token and the subwords after it), labelled by its first token
    (first), its most confident one (max), or the mean of its tokens' probabilities."""
    groups: list[list[dict]] = []
    for token in pre:
        if groups and token["subword"]:
            groups[-1].append(token)
        else:
            groups.append([token])
    words = []
    for group in groups:
        if strategy == "first":
            row = group[0]["scores"]
        elif strategy == "max":
            row = max(group, key=lambda token: token["scores"].max())["scores"]
        else:  # average
            row = np.nanmean(np.stack([token["scores"] for token in group]), axis=0)
        words.append(_labelled(row, labels) | _span(group[0], group[-1]))
    return words


def _tag(label: str) -> tuple[str, str]:
    """("B" or "I", the type): a label without a B-/I- prefix continues (I)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _grouped(found: list[dict]) -> list[dict]:
    """Adjacent entities of one type merged, a B- starting a new one; the score is the mean."""
    groups: list[list[dict]] = []
    for entity in found:
        bi, kind = _tag(entity["label"])
        if groups and kind == _tag(groups[-1][-1]["label"])[1] and bi != "B":
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return [
        {
            "label": group[0]["label"].split("-", 1)[-1],
            "score": float(np.nanmean([e["score"] for e in group])),
            **_span(group[0], group[-1]),
        }
        for group in groups
    ]
