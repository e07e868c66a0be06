"""Small real checkpoints saved with save_pretrained, for tests (no model hub here)."""

from __future__ import annotations

from pathlib import Path

LABELS = ("negative", "neutral", "positive")


def save_tiny_classifier(path: Path) -> Path:
    """A 2-layer BertForSequenceClassification, random weights with a fixed seed, and the
    bundled MiniLM tokenizer (bert-base-uncased's vocabulary): loads and runs in moments."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from numaserve.backends.modelpath import resolve_model_path

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        num_labels=len(LABELS),
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    BertForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    return path
