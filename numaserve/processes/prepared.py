"""What `numaserve prepare` resolved for one model, once, for every instance that serves it:
the checkpoint (its directory and digest) and, for each pool, the model path (a backend and a
precision), its artifact, and who chose it and why. The one record of what runs: here, below
the code that chooses, so that every reader (the supervisor, an instance, an HTTP front,
tune) reads it typed, and none reaches the choosing code.

A server's prepare step writes it to the server's runtime directory (`--record-dir`), and
each instance's spec names it (specs.WorkerSpec.prepared) and, once the supervisor has read
it, its pool's digest (`pool_digest`): an instance loads the artifact it is told, and never
hashes the checkpoint, judges or chooses. One written before is replaced
whole (a rename), so a restarting instance reads either the old record or the new one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import Backend, ModelConfig, Quantize


@dataclass(frozen=True)
class ModelPath:
    backend: Backend
    quantize: Quantize
    keep_fp32: tuple[str, ...] = ()

    def __str__(self) -> str:
        keep = f" keep_fp32 {','.join(self.keep_fp32)}" if self.keep_fp32 else ""
        return f"{self.backend} {self.quantize}{keep}"

    @classmethod
    def from_json(cls, data: dict) -> ModelPath:
        """A path as dataclasses.asdict wrote it (a kept choice, a prepared record)."""
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
    one text at a time) at the batch sizes the pool runs under load. `artifact`: None in a
    choice, which builds nothing; prepare's record names it."""

    from_batch: int
    path: ModelPath
    why: str
    artifact: str | None = None
    accuracy: str | None = None  # the gate's figures in each band of lengths it runs

    @classmethod
    def from_json(cls, data: dict | None) -> BatchedPath | None:
        if data is None:
            return None
        return cls(
            data["from_batch"],
            ModelPath.from_json(data["path"]),
            data["why"],
            data["artifact"],
            data.get("accuracy"),
        )

    def words(self) -> str:
        return f"{self.path} from {self.from_batch} texts a batch"


@dataclass(frozen=True)
class BandPath:
    """What one pool's instances run for its texts of at most `last` tokens (more than the
    band before's), where `quantize: auto` found another path faster and accurate there."""

    last: int
    path: ModelPath
    artifact: str | None
    why: str
    batched: BatchedPath | None = None  # its micro-batches' path, where another is faster
    accuracy: str | None = None  # the gate's figures in each band of lengths it runs

    @classmethod
    def from_json(cls, data: dict) -> BandPath:
        return cls(
            data["last"],
            ModelPath.from_json(data["path"]),
            data["artifact"],
            data["why"],
            BatchedPath.from_json(data.get("batched")),
            data.get("accuracy"),
        )


@dataclass(frozen=True)
class PoolPath:
    """What one pool's instances run."""

    path: ModelPath
    artifact: str | None  # the ONNX file or CTranslate2 directory; None: torch, from the checkpoint
    why: str | None = None  # where `quantize: auto` chose it; None: the config named it
    shorter: tuple[BandPath, ...] = ()  # its shorter texts' paths, shortest first
    # The accuracy gate's figures on this CPU, in each band of lengths the path runs: auto's
    # and a named precision's alike (a named one's also says whether it passes).
    accuracy: str | None = None
    batched: BatchedPath | None = None  # its micro-batches' path, where another is faster

    @property
    def bands(self) -> tuple[BandPath | PoolPath, ...]:
        """Its shorter texts' paths, shortest first, then its own."""
        return (*self.shorter, self)

    @property
    def by_band(self) -> tuple[tuple[int | None, int, ModelPath, str | None], ...]:
        """Each path the pool holds for the texts it runs: (the band's last tokens, None for
        the pool's own; the micro-batches it runs from, 1 for every one; the path; the gate's
        figures there), shortest band first."""
        bands = [(b.last if isinstance(b, BandPath) else None, b) for b in self.bands]
        found = []
        for last, b in bands:
            found.append((last, 1, b.path, b.accuracy))
            if b.batched:
                found.append((last, b.batched.from_batch, b.batched.path, b.batched.accuracy))
        return tuple(found)

    @property
    def paths(self) -> tuple[tuple[ModelPath, str | None], ...]:
        """Every path the pool's instances hold, with its artifact, each once."""
        bands: tuple[PoolPath | BandPath, ...] = (self, *self.shorter)
        found = [(b.path, b.artifact) for b in bands]
        found += [(b.batched.path, b.batched.artifact) for b in bands if b.batched]
        return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Prepared:
    model: str  # model.path as the config gives it
    directory: str  # where it resolved to
    digest: str  # the checkpoint's files (artifacts.model_digest)
    pools: dict[str, PoolPath]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Prepared:
        pools = {
            name: PoolPath(
                ModelPath.from_json(p["path"]),
                p["artifact"],
                p["why"],
                tuple(BandPath.from_json(b) for b in p["shorter"]),
                p["accuracy"],
                BatchedPath.from_json(p.get("batched")),
            )
            for name, p in data["pools"].items()
        }
        return cls(data["model"], data["directory"], data["digest"], pools)

    def write(self, path: Path) -> None:
        write_atomically(path, json.dumps(self.to_json(), indent=1))

    @classmethod
    def read(cls, path: str | Path) -> Prepared:
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(
                f"cannot read what `numaserve prepare` resolved for this model ({path}: "
                f"{type(e).__name__}: {e}); a start runs it before any instance"
            ) from None

    def pool_digest(self, pool: str) -> str:
        """What one pool's instances run, as one value: the checkpoint's digest and the pool's
        path, artifact and why. A spec carries it (specs.WorkerSpec.prepared_digest), so a
        reload renews an instance whose pool's record changed, and an instance knows whether
        the record it reads is the one its spec was made from."""
        entry = self.pools.get(pool)
        body = {"digest": self.digest, "pool": entry and dataclasses.asdict(entry)}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def config_for(self, config: ModelConfig, pool: str) -> tuple[ModelConfig, PoolPath]:
        """`config` running its pool's path, and that path's record."""
        try:
            entry = self.pools[pool]
        except KeyError:
            raise ModelLoadError(
                f"`numaserve prepare` resolved pools {', '.join(self.pools)} of {self.model}, "
                f"not {pool}: prepare again (a start or a reload does)"
            ) from None
        return entry.path.applied_to(config), entry


def readable(paths: Iterable[str]) -> dict[str, Prepared]:
    """The records at `paths` that can be read now, by path. One missing (not prepared yet)
    or damaged is left out: the instance that names it says why, as it loads."""
    found = {}
    for path in set(paths):
        try:
            found[path] = Prepared.read(path)
        except ModelLoadError:
            continue
    return found


def write_atomically(path: Path, text: str) -> None:
    """`path` replaced whole, readable by all (a temporary file is its owner's alone): what
    root prepares, the user the service runs as must read."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:
        f.write(text)
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)
