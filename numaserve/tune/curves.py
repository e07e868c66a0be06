"""The model's measured speed: seconds for one forward pass of `batch` texts padded to `length`
tokens, on an instance of `cores` cores, for each model path, at a shape the runtime has run
just before (warm) and at one it has not (cold: probe.py says why they differ). Pure data and
interpolation."""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cell:
    path: str  # a processes.prepared.ModelPath, as str() spells it
    cores: int
    length: int
    batch: int
    seconds: float  # median of the timed passes, warm
    cold_seconds: float  # median of passes at shapes not run before

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Curves:
    cells: list[Cell] = field(default_factory=list)

    def add(self, cell: Cell) -> None:
        self.cells.append(cell)

    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.path for c in self.cells))

    def cores(self, path: str) -> tuple[int, ...]:
        return tuple(sorted({c.cores for c in self.cells if c.path == path}))

    def batches(self, path: str, cores: int) -> tuple[int, ...]:
        return tuple(sorted({c.batch for c in self.cells if (c.path, c.cores) == (path, cores)}))

    def points(
        self, path: str, cores: int, batch: int, cold: bool = False
    ) -> list[tuple[int, float]]:
        """(length, seconds) measured for this batch size, shortest first."""
        return sorted(
            (c.length, c.cold_seconds if cold else c.seconds)
            for c in self.cells
            if (c.path, c.cores, c.batch) == (path, cores, batch)
        )

    def seconds(
        self, path: str, cores: int, length: float, batch: int, cold: bool = False
    ) -> float:
        """A pass's time at `length` tokens: linear between the measured lengths, and on the
        line through the last two beyond them (attention grows faster than that, so lengths
        past the measured ones are predicted a little fast; measure up to model.max_length)."""
        points = self.points(path, cores, batch, cold)
        if not points:
            raise KeyError(f"no measurement of {path} on {cores} cores at batch {batch}")
        if len(points) == 1:
            return points[0][1] * length / points[0][0]
        lengths = [p[0] for p in points]
        i = min(max(bisect_left(lengths, length), 1), len(points) - 1)
        (l0, s0), (l1, s1) = points[i - 1], points[i]
        return max(s0 + (s1 - s0) * (length - l0) / (l1 - l0), 1e-9)

    def to_json(self) -> list[dict]:
        return [c.to_json() for c in self.cells]

    @classmethod
    def from_json(cls, data: list[dict]) -> Curves:
        return cls([Cell(**c) for c in data])


def composed(curves: Curves, label: str, runs) -> Curves:
    """`label`'s curve where each pass runs on the path `runs(length, batch)` names (its
    measured cell, relabelled): a pool that holds a path per band of lengths and per
    micro-batch size, as `quantize: auto` keeps them."""
    return Curves(
        [
            dataclasses.replace(c, path=label)
            for c in curves.cells
            if c.path == runs(c.length, c.batch)
        ]
    )
