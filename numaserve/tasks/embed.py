"""embed: one vector per text, pooled as the model's sentence-transformers modules say."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve import protocol
from numaserve.tasks.base import Head, Output, Task

if TYPE_CHECKING:
    import numpy as np

    from numaserve.tasks.pooling import Pooling


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # float32; unit length where the model normalises (bundled:minilm does)
    tokens: int
    truncated: bool


class Pooled(Head):
    def __init__(self, pooling: Pooling, width: int):
        self.pooling = pooling
        self.dim = width * len(pooling.modes)

    def __call__(self, out, mask, batch):
        return list(self.pooling(out, mask))

    def describe(self) -> dict:
        return {"dim": self.dim}


class Embed(Task):
    name = "embed"
    output = Output.HIDDEN_STATE

    def check_checkpoint(self, directory: Path, path: str) -> None:
        _pooling(directory)  # refuses a module numaserve cannot run

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Pooled(_pooling(directory), width)

    def to_wire(self, result) -> dict:
        return {"embedding": protocol.embedding_to_wire(result)}

    def from_wire(self, result: dict) -> Embedding:
        vector = protocol.embedding_from_wire(result["embedding"])
        return Embedding(vector, result["tokens"], result["truncated"])


def _pooling(directory: Path) -> Pooling:
    from numaserve.tasks.pooling import Pooling  # numpy: only once the worker is pinned

    return Pooling.read(directory)


EMBED = Embed()
