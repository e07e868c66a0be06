"""What `numaserve prepare` resolved for one model, once, for every instance that serves it:
the checkpoint (its directory and digest) and, for each pool, what it runs (config/paths.py's
PoolPath: its paths, the artifacts built for them, and who chose them and why). Here, below
the code that chooses, so that every reader (the supervisor, an instance, an HTTP front,
tune) reads it typed, and none reaches the choosing code.

A server's prepare step writes it to the server's runtime directory (`--record-dir`), and
each instance's spec names it (specs.WorkerSpec.prepared) and, once the supervisor has read
it, its pool's digest (`pool_digest`): an instance loads the artifact it is told, and never
hashes the checkpoint, judges or chooses. One written before is replaced
whole (a rename), so a restarting instance reads either the old record or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.paths import PoolPath
from numaserve.config.schema import ModelConfig


@dataclass(frozen=True)
class Prepared:
    model: str  # model.path as the config gives it
    directory: str  # where it resolved to
    digest: str  # the checkpoint's files (artifacts.model_digest)
    pools: dict[str, PoolPath]

    def to_json(self) -> dict:
        pools = {name: p.to_json() for name, p in self.pools.items()}
        return {"model": self.model, "directory": self.directory, "digest": self.digest} | {
            "pools": pools
        }

    @classmethod
    def from_json(cls, data: dict) -> Prepared:
        pools = {name: PoolPath.from_json(p) for name, p in data["pools"].items()}
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
        body = {"digest": self.digest, "pool": entry and entry.to_json()}
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
