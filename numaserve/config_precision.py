"""Which precisions each backend runs (model.backend x model.quantize), checked when the
config is read, so that a combination no backend implements fails at load, not at start."""

from __future__ import annotations

# quantize values each backend implements; "auto" (backends/choice.py) is for all of them.
PRECISIONS = {
    "onnxruntime": ("int8", "none"),
    "torch": ("int8", "none"),
    "openvino": ("bf16", "none"),
}


def precision_problem(
    backend: str, quantize: str, keep_fp32: tuple[str, ...], where: str
) -> str | None:
    """What is wrong with this model's precision keys, or None."""
    if keep_fp32 and quantize != "int8":
        return (
            f"{where}.keep_fp32: names layers to leave out of int8, but {where}.quantize is "
            f"{quantize!r}, so no layer is int8; remove one of the two"
        )
    if quantize != "auto" and quantize not in PRECISIONS[backend]:
        offered = ", ".join(b for b, qs in PRECISIONS.items() if quantize in qs)
        return (
            f"{where}.quantize: {quantize} is not offered by backend {backend}, which runs "
            f"{' or '.join(PRECISIONS[backend])}; {quantize} runs on backend {offered}"
        )
    return None
