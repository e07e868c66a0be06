"""Which instruction-set extensions this CPU has, of those that decide how fast int8 and bf16
transformer kernels run (VNNI, BF16, AMX): shown by `numaserve topology`, and told to each
worker in its spec.

Read from the kernel's /proc/cpuinfo, whose flag names these are: py-cpuinfo read the same
file from a child interpreter it started, a second or more of every start, `numaserve
prepare` and instance."""

from __future__ import annotations

import json
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


class IsaError(ValueError):
    """Another CPU's extensions that cannot be read."""


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


def read_isa(value: str) -> tuple[str, ...]:
    """Another CPU's extensions (`numaserve prepare --for-cpu`), from a file `numaserve
    topology --json` wrote on it or a comma list of their names (`avx2`: an AVX2-only CPU),
    in INTERESTING_ISA's order."""
    path = Path(value)
    if path.is_file():
        try:
            names = json.loads(path.read_text())["isa"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise IsaError(
                f"--for-cpu {value}: not what `numaserve topology --json` writes ({e!r})"
            ) from None
    else:
        names = [n.strip() for n in value.split(",") if n.strip()]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise IsaError(f"--for-cpu {value}: its isa is not a list of extension names")
    unknown = [n for n in names if n not in INTERESTING_ISA]
    if unknown or "avx2" not in names:
        raise IsaError(
            f"--for-cpu {value}: "
            + (f"unknown extensions {', '.join(unknown)}; " if unknown else "no avx2; ")
            + f"name those of {', '.join(INTERESTING_ISA)} the CPU has (avx2 at the least), "
            "or give a file `numaserve topology --json` wrote on it"
        )
    return tuple(n for n in INTERESTING_ISA if n in names)
