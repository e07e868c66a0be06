"""TorchServe's handler for the peer benchmark: the ONNX artifact numaserve serves, run the way
numaserve's worker runs it (ONNX Runtime, sequential, intra-op threads from OMP_NUM_THREADS,
which TorchServe's CPU launcher sets to each worker's cores), the `tokenizers` tokenizer with
padding off (batch 1 has none to pad), mean pooling, unit length.

Runs inside TorchServe's own environment (.peers/torchserve), which has no numaserve: it
imports only onnxruntime, tokenizers and numpy. Requests are `{"text": ...}`; answers are
`{"embedding": [...]}`, as the other peers'.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

MAX_LENGTH = 256


class MeanPooledEmbedder:
    def __init__(self) -> None:
        self.session = None

    def initialize(self, context) -> None:
        directory = Path(context.system_properties["model_dir"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(
            str(directory / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_LENGTH)

    def embed(self, text: str) -> list[float]:
        encoding = self.tokenizer.encode(text)
        feeds = {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }
        feeds = {name: value for name, value in feeds.items() if name in self.inputs}
        hidden = self.session.run(["last_hidden_state"], feeds)[0][0]
        pooled = hidden.mean(axis=0)  # no padding: every token counts
        return (pooled / np.linalg.norm(pooled)).tolist()

    def handle(self, data: list[dict], context) -> list[dict]:
        """One answer per request of the batch TorchServe hands over (batch size 1 here)."""
        answers = []
        for request in data:
            body = request.get("body") or request.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            answers.append({"embedding": self.embed(body["text"])})
        return answers


_service = MeanPooledEmbedder()


def handle(data, context):
    """TorchServe's entry point: initialises once per worker, then handles each batch."""
    if _service.session is None:
        _service.initialize(context)
    return None if data is None else _service.handle(data, context)
