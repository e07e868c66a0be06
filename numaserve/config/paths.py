"""What a pool runs: its model paths (a runtime, a precision, the layers kept in fp32), by
band of lengths and by micro-batch size. One record family with one codec, read and written
by all who say what runs: `quantize: auto`'s choice (artifacts None: a choice builds
nothing), `numaserve prepare`'s record (processes/prepared.py, with the artifacts it built),
an instance's READY (who chose it: status/report.py's RunningPath), status, /metrics and
/info."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from numaserve.config.schema import Backend, ModelConfig, Quantize


@dataclass(frozen=True)
class ModelPath:
    backend: Backend
    quantize: Quantize
    keep_fp32: tuple[str, ...] = ()

    def __str__(self) -> str:
        keep = f" keep_fp32 {','.join(self.keep_fp32)}" if self.keep_fp32 else ""
        return f"{self.backend} {self.quantize}{keep}"

    def to_json(self) -> dict:
        return _json(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelPath:
        return cls(data["backend"], data["quantize"], tuple(data["keep_fp32"]))

    def applied_to(self, config: ModelConfig) -> ModelConfig:
        """`config` running this path."""
        return dataclasses.replace(
            config, backend=self.backend, quantize=self.quantize, keep_fp32=self.keep_fp32
        )


@dataclass(frozen=True)
class BatchedPath:
    """A band's throughput path: its micro-batches of at least `from_batch` texts run here,
    where `quantize: auto` timed it ahead of the band's own path (its latency path, fastest
    one text at a time) at the batch sizes the pool runs under load."""

    from_batch: int
    path: ModelPath
    why: str
    accuracy: str | None = None  # the gate's figures in each band of lengths it runs
    artifact: str | None = None  # what prepare built for it; None in a choice

    def words(self) -> str:
        return f"{self.path} from {self.from_batch} texts a batch"

    def to_json(self) -> dict:
        return _json(self)

    @classmethod
    def from_json(cls, data: dict | None) -> BatchedPath | None:
        if data is None:
            return None
        return cls(
            data["from_batch"],
            ModelPath.from_json(data["path"]),
            data["why"],
            data.get("accuracy"),
            data.get("artifact"),
        )


@dataclass(frozen=True)
class BandPath:
    """The path a pool runs for its texts of at most `last` tokens (more than the band
    before's), where its own path fails the gate on texts of these lengths or loses there."""

    last: int
    path: ModelPath
    why: str
    batched: BatchedPath | None = None  # its micro-batches' path, where another is faster
    accuracy: str | None = None  # the gate's figures in each band of lengths it runs
    artifact: str | None = None  # what prepare built for it; None in a choice

    def to_json(self) -> dict:
        return _json(self)

    @classmethod
    def from_json(cls, data: dict) -> BandPath:
        return cls(
            data["last"],
            ModelPath.from_json(data["path"]),
            data["why"],
            BatchedPath.from_json(data.get("batched")),
            data.get("accuracy"),
            data.get("artifact"),
        )


@dataclass(frozen=True)
class PoolPath:
    """What one pool's instances run: its own path, its shorter texts' (by length, shortest
    first) and its micro-batches', where `quantize: auto` found others faster and accurate."""

    path: ModelPath
    why: str | None = None  # where `quantize: auto` chose it; None: the config named it
    shorter: tuple[BandPath, ...] = ()
    batched: BatchedPath | None = None
    # The accuracy gate's figures on this CPU, in each band of lengths the path runs: auto's
    # and a named precision's alike (a named one's also says whether it passes).
    accuracy: str | None = None
    artifact: str | None = None  # what prepare built; None in a choice, and for torch

    def to_json(self) -> dict:
        return _json(self)

    @classmethod
    def from_json(cls, data: Any) -> PoolPath:
        return cls(
            ModelPath.from_json(data["path"]),
            data.get("why"),
            tuple(BandPath.from_json(b) for b in data.get("shorter") or ()),
            BatchedPath.from_json(data.get("batched")),
            data.get("accuracy"),
            data.get("artifact"),
        )

    @property
    def bands(self) -> tuple[BandPath | PoolPath, ...]:
        """Its shorter texts' paths, shortest first, then its own."""
        return (*self.shorter, self)

    @property
    def by_band(self) -> tuple[tuple[int | None, int, ModelPath, str | None], ...]:
        """Each path the pool holds for the texts it runs: (the band's last tokens, None for
        the pool's own; the micro-batches it runs from, 1 for every one; the path; the gate's
        figures there), shortest band first."""
        found = []
        for b in self.bands:
            last = b.last if isinstance(b, BandPath) else None
            found.append((last, 1, b.path, b.accuracy))
            if b.batched:
                found.append((last, b.batched.from_batch, b.batched.path, b.batched.accuracy))
        return tuple(found)

    @property
    def paths(self) -> tuple[tuple[ModelPath, str | None], ...]:
        """Every path the pool's instances hold, with its artifact, each once: its own first."""
        bands: tuple[PoolPath | BandPath, ...] = (self, *self.shorter)
        found = [(b.path, b.artifact) for b in bands]
        found += [(b.batched.path, b.batched.artifact) for b in bands if b.batched]
        return tuple(dict.fromkeys(found))

    @property
    def held(self) -> tuple[ModelPath, ...]:
        """Every path the pool's instances hold, each once."""
        return tuple(dict.fromkeys(path for path, _ in self.paths))

    def runs(self, tokens: int, texts: int) -> ModelPath:
        """The path a pass of `texts` texts of `tokens` tokens runs on (as banded.py runs it)."""
        band = next((s for s in self.shorter if tokens <= s.last), self)
        if band.batched and texts >= band.batched.from_batch:
            return band.batched.path
        return band.path


def _json(record) -> dict:
    """A record as JSON: its fields by name, the nested ones by their own codec."""
    out: dict = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if hasattr(value, "to_json"):
            value = value.to_json()
        elif isinstance(value, tuple) and value and hasattr(value[0], "to_json"):
            value = [v.to_json() for v in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out
