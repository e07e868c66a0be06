"""The kernel's two CPU set formats: lists ("0-3,8,10-11", sysfs `*_list`, /proc, numactl) and
hex masks ("00000000,0000ff0f", sysfs `cpumap`, `thread_siblings`, ...: 32-bit words, most
significant first)."""

from __future__ import annotations

from collections.abc import Iterable


class CPUListError(ValueError):
    pass


BLANK = " \t\n\x00"  # what ends a sysfs file: some kernels (seen on 5.15) add a NUL byte


def parse_cpumask(text: str) -> list[int]:
    """Parse a hex mask such as "00000000,0000ff0f" into [0, 1, 2, 3, 8, ..., 15]."""
    digits = text.strip(BLANK).replace(",", "")
    try:
        bits = int(digits, 16) if digits else 0
    except ValueError:
        raise CPUListError(f"not a CPU mask: {text!r}") from None
    return [cpu for cpu in range(bits.bit_length()) if bits >> cpu & 1]


def parse_cpulist(text: str) -> list[int]:
    """Parse "0-3,8" into [0, 1, 2, 3, 8]. An empty string is an empty list (a memory-only node)."""
    cpus: set[int] = set()
    text = text.strip(BLANK)
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
