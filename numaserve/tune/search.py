"""Which configuration serves a workload best, predicted from the measured curves. Pure.

For a candidate (a model path, pools by length with their cores per instance and instance
counts, `max_batch` and `max_batch_tokens`), each text goes to the first pool whose
max_tokens holds it and, under load, runs in a batch as large as the limits allow (the
router's rules: `max_batch` texts, `max_batch_tokens` padded tokens, a text alone always).
A pool's capacity is its instances over its texts' mean cost (a pass's time over its texts);
the candidate's throughput is the traffic at which its busiest pool is full; its p99 is
QUEUEING times the pass that the 99th-percentile text runs in (its own pass, and about one
more it waits for under load). A pass costs the warm figure at a shape the runtime keeps
compiled (its pool's most frequent ones), the cold one at any other. The search keeps what meets the p99 target, fastest first;
`verify.py` then measures the best few for real, so the model only has to rank them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

from numaserve.tune.curves import Curves
from numaserve.tune.workload import Workload

PADDING = 1.1  # a batch pads to its longest text; the router keeps that within 1.25x
QUEUEING = 2.0  # p99: the slowest texts' own pass and about one they wait for
BAND_QUANTILES = (0.5, 0.75, 0.9, 0.95)  # where a pool boundary may go
MAX_POOLS = 3
BATCH_TOKENS = (128, 256, 512, 1024)  # max_batch_tokens tried
ALIGN = 8  # pool limits are multiples of this


@dataclass(frozen=True)
class Pool:
    max_tokens: int
    cores: int  # per instance
    instances: int


@dataclass(frozen=True)
class Candidate:
    path: str
    pools: tuple[Pool, ...]
    max_batch: int
    max_batch_tokens: int

    @property
    def cores(self) -> int:
        return sum(p.cores * p.instances for p in self.pools)

    def describe(self) -> str:
        pools = ", ".join(f"<={p.max_tokens}: {p.instances}x{p.cores}" for p in self.pools)
        return f"{self.path}; pools {pools}; max_batch {self.max_batch}/{self.max_batch_tokens}"


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    texts_per_s: float
    p99_ms: float


def batch_size(length: float, max_batch: int, max_batch_tokens: int, measured) -> int:
    """The batch a text of `length` padded tokens runs in under load, as a measured size."""
    allowed = max(1, min(max_batch, int(max_batch_tokens // length)))
    return max((b for b in measured if b <= allowed), default=min(measured))


class Predictor:
    """Predictions for one workload on one set of curves, each pool's figures worked out once."""

    def __init__(
        self, workload: Workload, curves: Curves, kept_shapes: Mapping[str, int] | None = None
    ):
        """`kept_shapes`: by model path, the input shapes its runtime keeps compiled (a path
        not named: every one). Traffic of few lengths runs warm, of many, mostly cold
        (curves.py); `warm_share` says how much."""
        self.workload = workload
        self.curves = curves
        self.kept_shapes = dict(kept_shapes or {})
        self._pool = lru_cache(maxsize=None)(self._pool_figures)

    def _pool_figures(
        self, path: str, cores: int, low: int, high: int, max_batch: int, batch_tokens: int
    ) -> tuple[int, float, tuple[tuple[float, int], ...]]:
        """Texts in (low, high], their mean cost in seconds, and (pass seconds, texts)."""
        measured = self.curves.batches(path, cores)
        lengths = []  # (length, texts, batch, padded)
        for length, n in self.workload.within(low, high):
            padded = min(length * PADDING, high)
            lengths.append(
                (length, n, batch_size(padded, max_batch, batch_tokens, measured), padded)
            )
        warm = warm_share([(n, b) for _, n, b, _ in lengths], self.kept_shapes.get(path))
        texts, cost, passes = 0, 0.0, []
        for (_, n, batch, padded), share in zip(lengths, warm, strict=True):
            hot = self.curves.seconds(path, cores, padded, batch)
            cold = self.curves.seconds(path, cores, padded, batch, cold=True)
            seconds = share * hot + (1 - share) * cold
            texts += n
            cost += n * seconds / batch
            passes.append((seconds, n))
        return texts, (cost / texts if texts else 0.0), tuple(passes)

    def figures(self, c: Candidate) -> list[tuple[int, float, tuple]]:
        lows = (0, *(p.max_tokens for p in c.pools[:-1]))
        return [
            self._pool(c.path, p.cores, low, p.max_tokens, c.max_batch, c.max_batch_tokens)
            for low, p in zip(lows, c.pools, strict=True)
        ]

    def p99_ms(self, figures) -> float:
        passes = sorted(p for _, _, pool in figures for p in pool)
        wanted, seen = math.ceil(0.99 * self.workload.texts), 0
        for seconds, n in passes:
            seen += n
            if seen >= wanted:
                return QUEUEING * seconds * 1000
        return 0.0

    def predict(self, c: Candidate) -> Prediction:
        figures = self.figures(c)
        return Prediction(
            c, throughput(figures, [p.instances for p in c.pools]), self.p99_ms(figures)
        )


def warm_share(lengths: list[tuple[int, int]], kept: int | None) -> list[float]:
    """For each length of a pool's traffic, (texts, batch limit) each, the share of its
    passes at a shape the runtime keeps. Under load a pass takes any size from 1 to its
    limit, so a length brings that many shapes, each with an equal share of its passes; the
    runtime keeps the `kept` most frequent (None: all)."""
    if kept is None:
        return [1.0] * len(lengths)
    share = [0.0] * len(lengths)
    by_frequency = sorted(range(len(lengths)), key=lambda i: -lengths[i][0] / lengths[i][1] ** 2)
    for i in by_frequency:
        batch = lengths[i][1]
        taken = min(batch, kept)
        share[i] = taken / batch
        kept -= taken
        if not kept:
            break
    return share


def throughput(figures, instances: list[int]) -> float:
    """Texts a second when the busiest pool is full: each pool serves its share."""
    total = sum(texts for texts, _, _ in figures)
    rates = [
        n / cost / (texts / total)
        for (texts, cost, _), n in zip(figures, instances, strict=True)
        if texts
    ]
    return min(rates) if rates else 0.0


def share_cores(figures, per_instance: list[int], cores: int) -> list[int] | None:
    """Instances per pool on `cores` cores: one each, then one more to the busiest pool while
    it fits, then what is left to whichever pools it fits, busiest first. None: no fit."""
    counts = [1] * len(per_instance)
    left = cores - sum(per_instance)
    if left < 0:
        return None

    def load(i: int) -> float:  # a pool's busy share per instance: higher is busier
        texts, cost, _ = figures[i]
        return texts * cost / counts[i]

    while True:
        busiest = sorted(range(len(counts)), key=load, reverse=True)
        fits = [i for i in busiest if per_instance[i] <= left]
        if not fits:
            return counts
        counts[fits[0]] += 1
        left -= per_instance[fits[0]]


def band_sets(workload: Workload) -> list[tuple[int, ...]]:
    """Each pool set's max_tokens, last the model's max_length: one pool, or splits at the
    workload's quantiles (rounded up to ALIGN tokens)."""
    edges = sorted(
        {
            math.ceil(workload.quantile(q) / ALIGN) * ALIGN
            for q in BAND_QUANTILES
            if math.ceil(workload.quantile(q) / ALIGN) * ALIGN < workload.max_length
        }
    )
    sets = []
    for n in range(MAX_POOLS):
        sets += [(*split, workload.max_length) for split in itertools.combinations(edges, n)]
    return sets


def shapes(workload: Workload, curves: Curves, path: str, cores: int):
    """Each candidate's pools, batching and cores per instance, one instance a pool."""
    measured_cores = [k for k in curves.cores(path) if k <= cores]
    batches = curves.batches(path, min(measured_cores, default=1))
    for bands, batch, tokens in itertools.product(band_sets(workload), batches, BATCH_TOKENS):
        for ks in itertools.product(measured_cores, repeat=len(bands)):
            pools = tuple(Pool(b, k, 1) for b, k in zip(bands, ks, strict=True))
            yield Candidate(path, pools, batch, tokens)


def search(predictor: Predictor, cores: int, p99_ms: float) -> list[Prediction]:
    """Every candidate on at most `cores` cores, those predicted within `p99_ms` first,
    fastest first; then the rest, lowest p99 first."""
    workload, curves = predictor.workload, predictor.curves
    found = []
    for path in curves.paths():
        for shape in shapes(workload, curves, path, cores):
            figures = predictor.figures(shape)
            if any(not texts for texts, _, _ in figures[:-1]):
                continue  # a pool no text reaches
            counts = share_cores(figures, [p.cores for p in shape.pools], cores)
            if counts is None:
                continue
            pools = tuple(replace(p, instances=n) for p, n in zip(shape.pools, counts, strict=True))
            c = replace(shape, pools=pools)
            found.append(Prediction(c, throughput(figures, counts), predictor.p99_ms(figures)))
    within = [p for p in found if p.p99_ms <= p99_ms]
    rest = [p for p in found if p.p99_ms > p99_ms]
    return sorted(within, key=lambda p: -p.texts_per_s) + sorted(rest, key=lambda p: p.p99_ms)


def to_verify(ranked: list[Prediction], count: int, fits) -> list[Prediction]:
    """What to measure for real: the best candidate of each model path (the prediction's
    worst error is between runtimes: OpenVINO's shapes), then the next best, `count` in all
    or one a path; only candidates `fits` (they plan on the cores free), in rank order."""
    chosen: list[Prediction] = []
    paths: set[str] = set()
    for p in ranked:
        if p.candidate.path not in paths and fits(p.candidate):
            chosen.append(p)
            paths.add(p.candidate.path)
    for p in ranked:
        if len(chosen) >= count:
            break
        if p not in chosen and fits(p.candidate):
            chosen.append(p)
    return sorted(chosen, key=ranked.index)
