"""One instance's model where its pool runs more than one model path: texts of each band of
lengths on the path that was the fastest accurate there (choice.py's PoolChoice.shorter).

int8 is accurate and fast on a pool's long texts and can lose too much on its shortest ones
(a vector of a few tokens averages none of its errors out; on AVX2 without VNNI its products
also saturate); fp32 on those costs little, since they are short. So an instance holds both
and runs each text on its band's path; a micro-batch that spans bands runs once per band.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from numaserve.backends.base import Model


class Banded:
    """The pool's own model, and the models of its shorter bands: [(last tokens, model)],
    shortest first. Everything but run() is the pool's own model's (the same checkpoint,
    head and labels)."""

    def __init__(self, main: Model, shorter: list[tuple[int, Model]]) -> None:
        self.main, self.shorter = main, shorter
        self._lasts = [last for last, _ in shorter]
        self.choice = self.prepared = None

    def __getattr__(self, name: str):
        return getattr(self.main, name)

    @property
    def weights(self) -> tuple:
        """Every path's shared weights files, each once."""
        models = [self.main, *(model for _, model in self.shorter)]
        return tuple(dict.fromkeys(w for m in models for w in m.weights))

    def model_for(self, tokens: int) -> Model:
        """The model that runs a text of `tokens` tokens."""
        at = bisect.bisect_left(self._lasts, tokens)
        return self.shorter[at][1] if at < len(self.shorter) else self.main

    def run(
        self, batch: list[list[int]], segments: list[int] | None = None, whole: Sequence[int] = ()
    ) -> list:
        groups: dict[int, list[int]] = {}  # by model, the batch's inputs it runs
        models = {}
        for i, ids in enumerate(batch):
            model = self.model_for(len(ids))
            models[id(model)] = model
            groups.setdefault(id(model), []).append(i)
        if len(groups) == 1:
            (model,) = models.values()
            results = model.run(batch, segments, whole)
            self.head_s = model.head_s
            return results
        results = [None] * len(batch)
        self.head_s = 0.0  # each path's head, for the pass's trace
        for key, rows in groups.items():
            part = models[key].run(
                [batch[i] for i in rows],
                [segments[i] for i in rows] if segments else None,
                [rows.index(i) for i in whole if i in rows],
            )
            self.head_s += models[key].head_s
            for i, result in zip(rows, part, strict=True):
                results[i] = result
        return results
