"""Which instruction-set extensions this CPU has, of those that decide how fast int8 and bf16
transformer kernels run (VNNI, BF16, AMX): shown by `numaserve topology`, and told to each
worker in its spec."""

from __future__ import annotations

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


def detect_isa() -> tuple[str, ...]:
    import cpuinfo  # py-cpuinfo; imported late because it is slow to start

    flags = set(cpuinfo.get_cpu_info().get("flags", ()))
    return tuple(f for f in INTERESTING_ISA if f in flags)
