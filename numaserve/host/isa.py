"""Which instruction-set extensions this CPU has, of those that decide how fast int8 and bf16
transformer kernels run (VNNI, BF16, AMX): shown by `numaserve topology`, and told to each
worker in its spec.

Read from the kernel's /proc/cpuinfo, whose flag names these are: py-cpuinfo read the same
file from a child interpreter it started, a second or more of every start, `numaserve
prepare` and instance."""

from __future__ import annotations

from pathlib import Path

INTERESTING_ISA = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
CPUINFO = Path("/proc/cpuinfo")


def detect_isa() -> tuple[str, ...]:
    try:
        return isa_from_cpuinfo(CPUINFO.read_text(errors="replace"))
    except OSError:  # no /proc (not Linux): numaserve plans without the ISA
        return ()


def isa_from_cpuinfo(text: str) -> tuple[str, ...]:
    """The interesting extensions the first `flags` line names (every CPU's are the same)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
            return tuple(f for f in INTERESTING_ISA if f in flags)
    return ()
