"""One instance's model where its pool runs more than one model path: each text on its band
of lengths' path, and each band's micro-batches from a size on its throughput path, each
where `quantize: auto` timed it the fastest accurate there (choice.py).

int8 is accurate and fast on a pool's long texts and can lose too much on its shortest ones
(a vector of a few tokens averages none of its errors out; on AVX2 without VNNI its products
also saturate), so those run another path. And which path is fastest depends on the load:
one text at a time a path with the least overhead a pass wins (CTranslate2), while eight
or more texts a pass favour the widest products (bf16 on AMX). So an instance holds each
path once, runs each text on its band's, and a micro-batch that spans bands runs once per
path it needs. It counts the passes each path ran, for `numaserve status` and /metrics.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from numaserve.backends.base import Model


@dataclass(frozen=True)
class Segment:
    """One band of a pool's lengths: texts of at most `last` tokens (None: every longer one,
    the pool's own band) run on `alone`, and a band's share of a micro-batch of at least
    `from_batch` texts on `batched`, where it has one."""

    last: int | None
    alone: Model
    batched: Model | None = None
    from_batch: int = 0

    def model_for(self, texts: int) -> Model:
        """The model that runs `texts` texts of this band in one pass."""
        if self.batched is not None and texts >= self.from_batch:
            return self.batched
        return self.alone


class Banded:
    """The pool's own band's paths and its shorter bands', shortest first. Everything but
    run() is the pool's own model's (the same checkpoint, head and labels)."""

    def __init__(self, segments: Sequence[Segment], names: dict[int, str]) -> None:
        """`names`: each model's path as ModelPath spells it, by id(model)."""
        *shorter, own = segments
        if own.last is not None or any(s.last is None for s in shorter):
            raise ValueError("the pool's own band comes last, and it alone has no `last`")
        self.segments, self.main = tuple(segments), own.alone
        self._lasts = [s.last for s in shorter]
        self.names = names
        self.ran = {name: 0 for name in dict.fromkeys(names.values())}  # passes, by path
        self.choice = self.prepared = None

    def __getattr__(self, name: str):
        return getattr(self.main, name)

    @property
    def weights(self) -> tuple:
        """Every path's shared weights files, each once."""
        models = {id(m): m for s in self.segments for m in (s.alone, s.batched) if m}
        return tuple(dict.fromkeys(w for m in models.values() for w in m.weights))

    def run(
        self, batch: list[list[int]], segments: list[int] | None = None, whole: Sequence[int] = ()
    ) -> list:
        bands: dict[int, list[int]] = {}  # the batch's inputs by their band's index
        for i, ids in enumerate(batch):
            bands.setdefault(bisect.bisect_left(self._lasts, len(ids)), []).append(i)
        groups: dict[int, list[int]] = {}  # the batch's inputs by the model that runs them
        models = {}
        for band, rows in bands.items():
            model = self.segments[band].model_for(len(rows))
            models[id(model)] = model
            groups.setdefault(id(model), []).extend(rows)
        if len(groups) == 1:  # the common case: the whole batch on one path, as it came
            (key,) = groups
            results = models[key].run(batch, segments, whole)
            self.head_s = models[key].head_s
            self.ran[self.names[key]] += 1
            return results
        results: list = [None] * len(batch)
        self.head_s = 0.0  # each path's head, for the pass's trace
        for key, rows in groups.items():
            rows.sort()
            part = models[key].run(
                [batch[i] for i in rows],
                [segments[i] for i in rows] if segments else None,
                [rows.index(i) for i in whole if i in rows],
            )
            self.head_s += models[key].head_s
            self.ran[self.names[key]] += 1
            for i, result in zip(rows, part, strict=True):
                results[i] = result
        return results
