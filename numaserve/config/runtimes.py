"""Which precisions each backend runs (model.backend x model.quantize), checked when the
config is read, so that a combination no backend implements fails at load, not at start."""

from __future__ import annotations

# quantize values each backend implements; "auto" (backends/choice.py) is for all of them.
# `backend: auto` with a named precision runs it on the first backend here that offers it.
PRECISIONS = {
    "onnxruntime": ("int8", "none"),
    "openvino": ("int8", "bf16", "none"),
    "torch": ("int8", "none"),
    "ctranslate2": ("int8", "int16", "none"),
}
# Backends that can leave named layers out of int8 (model.keep_fp32).
KEEPS_FP32 = ("onnxruntime", "torch", "auto")


def precision_problem(
    backend: str, quantize: str, keep_fp32: tuple[str, ...], where: str
) -> str | None:
    """What is wrong with this model's precision keys, or None."""
    if keep_fp32 and quantize == "auto":
        return (
            f"{where}.keep_fp32: names layers to leave out of int8, which {where}.quantize: "
            "auto chooses by itself (with its own layers kept); set quantize: int8 to keep these"
        )
    if keep_fp32 and backend not in KEEPS_FP32:
        return (
            f"{where}.keep_fp32: backend {backend} quantizes every Linear layer or none; "
            f"keep_fp32 is for backend {' or '.join(KEEPS_FP32[:-1])}"
        )
    if keep_fp32 and quantize != "int8":
        return (
            f"{where}.keep_fp32: names layers to leave out of int8, but {where}.quantize is "
            f"{quantize!r}, so no layer is int8; remove one of the two"
        )
    if "auto" not in (backend, quantize) and quantize not in PRECISIONS[backend]:
        offered = ", ".join(b for b, qs in PRECISIONS.items() if quantize in qs)
        return (
            f"{where}.quantize: {quantize} is not offered by backend {backend}, which runs "
            f"{' or '.join(PRECISIONS[backend])}; {quantize} runs on backend {offered}"
        )
    return None


def needs_prepare(backend: str, quantize: str) -> bool:
    """Whether `numaserve prepare` has work for this model: an ONNX artifact to build, a
    choice to make (`auto`), or a precision below fp32 to judge (what it costs here). Only
    torch in fp32 loads the checkpoint as it is, with nothing to prepare."""
    return backend != "torch" or quantize != "none"
