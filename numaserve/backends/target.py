"""Preparing on one CPU for another (`numaserve prepare --for-cpu`): an image built on a CI
runner, or a build host, judges and chooses for the fleet's CPU, so that the fleet's first
start finds its choice kept instead of judging again (half a minute here, and 25 minutes
on an emulated Haswell).

What makes a path accurate on a CPU is the kernels its ISA extensions run: AVX2 alone sums
int8 products in saturating int16 where VNNI and AMX sum them exactly, bf16 runs only on
AVX512_BF16 or AMX, and CTranslate2 runs MKL (int16) only on Intel. So the choice is made
for the target's extensions (its cache key holds them: the fleet's CPU finds it, any other
chooses again), with this CPU's kernels capped to the target's where the runtimes let an
environment variable cap them: oneDNN (CTranslate2's and OpenVINO's) by ONEDNN_MAX_CPU_ISA,
and for a target without AVX-512, CTranslate2 without MKL (an AMD EPYC's kernels, the
stricter of the two AVX2 vendors; an Intel AVX2 CPU may run int16 besides). ONNX Runtime's
artifact is built for the target's extensions (7-bit weights without VNNI), which makes its
sums the same on both. A target with an extension this CPU lacks cannot be judged here.
"""

from __future__ import annotations


class TargetError(ValueError):
    """A target CPU that cannot be judged on this one."""


def kernels_for(target: tuple[str, ...], here: tuple[str, ...]) -> dict[str, str]:
    """The environment that runs the target's kernels on this CPU (the runtimes' caps; none
    where the two are alike). Refused where the target has an extension this CPU lacks."""
    missing = [n for n in target if n not in here]
    if missing:
        raise TargetError(
            f"--for-cpu: the target CPU has {', '.join(missing)}, which this one lacks: its "
            "kernels cannot run here to be judged and timed. Prepare on a CPU that has them "
            "(the target itself, or one with more), or let the target choose at its first start"
        )
    if set(target) == set(here):
        return {}
    if "avx512f" not in target:  # AVX2 alone: AMD's kernels (no MKL), VEX VNNI if it has it
        return {
            "CT2_USE_MKL": "0",
            "ONEDNN_MAX_CPU_ISA": "AVX2_VNNI" if "avx_vnni" in target else "AVX2",
        }
    for flag, cap in (
        ("amx_int8", "AVX512_CORE_AMX"),
        ("avx512_bf16", "AVX512_CORE_BF16"),
        ("avx512_vnni", "AVX512_CORE_VNNI"),
    ):
        if flag in target:
            return {"ONEDNN_MAX_CPU_ISA": cap}
    return {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}


def describe(target: tuple[str, ...], kernels: dict[str, str]) -> str:
    """One line for the log: what the choice is made for, and how."""
    how = (
        "this CPU's kernels capped to its ("
        + " ".join(f"{k}={v}" for k, v in kernels.items())
        + ")"
        if kernels
        else "this CPU's own kernels (the same extensions)"
    )
    return f"preparing for a CPU with {' '.join(target)}: judged and timed on {how}"
