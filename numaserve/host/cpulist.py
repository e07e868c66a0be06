"""The kernel's CPU list format ("0-3,8,10-11"), used by sysfs, /proc and numactl."""

from __future__ import annotations

from collections.abc import Iterable


class CPUListError(ValueError):
    pass


def parse_cpulist(text: str) -> list[int]:
    """Parse "0-3,8" into [0, 1, 2, 3, 8]. An empty string is an empty list (a memory-only node)."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise CPUListError(f"not a CPU list: {text!r} (bad element {part!r})") from None
        if first < 0 or last < first:
            raise CPUListError(f"not a CPU list: {text!r} (bad range {part!r})")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format [0, 1, 2, 3, 8] as "0-3,8", the form numactl and taskset accept."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)
