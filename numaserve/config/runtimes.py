"""The model runtimes (model.backend), one record each: what the config checks (its
precisions, whether it keeps named layers in fp32), what `auto` tries, what `numaserve
prepare` builds and an instance loads. backends/ reads the same records to load and build;
a new runtime is its module(s) in backends/ and one row here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Runtime:
    name: str  # model.backend
    precisions: tuple[str, ...]  # the model.quantize values it runs ("auto" is for all)
    loads: str  # "module:Model" in numaserve.backends: an instance's model, from the artifact
    builds: str | None = None  # "module:artifact_for": what prepare builds; None: the checkpoint
    artifact: str = ""  # what it builds, in messages
    keeps_fp32: bool = False  # can leave named layers out of int8 (model.keep_fp32)
    in_auto: bool = False  # among `backend: auto`'s candidates
    packages: tuple[str, ...] = ()  # whose versions a choice judged on it depends on
    per_shape: bool = False  # compiles a kernel per input shape: timing warms each first
    shares_weights: bool = False  # prepare packs its artifact, mapped once per NUMA node


# In this order, `backend: auto` with a named precision runs the first runtime offering it.
RUNTIMES = (
    Runtime(
        "onnxruntime",
        ("int8", "none"),
        "onnx:OnnxModel",
        "onnx_build:artifact_for",
        "ONNX artifact",
        keeps_fp32=True,
        in_auto=True,
        packages=("onnxruntime",),
        shares_weights=True,
    ),
    Runtime(
        "openvino",
        ("int8", "bf16", "none"),
        "openvino:OpenVinoModel",
        "openvino_build:artifact_for",
        "OpenVINO model",
        in_auto=True,
        packages=("openvino", "nncf"),
        per_shape=True,
    ),
    Runtime("torch", ("int8", "none"), "torch:TorchModel", keeps_fp32=True),
    Runtime(
        "ctranslate2",
        ("int8", "int16", "none"),
        "ct2:Ct2Model",
        "ct2_build:artifact_for",
        "CTranslate2 model",
        in_auto=True,
        packages=("ctranslate2",),
    ),
)
BY_NAME = {r.name: r for r in RUNTIMES}
PRECISIONS = {r.name: r.precisions for r in RUNTIMES}
KEEPS_FP32 = (*(r.name for r in RUNTIMES if r.keeps_fp32), "auto")


def runtime(name: str) -> Runtime:
    """The record of model.backend `name` (a concrete one: not "auto")."""
    return BY_NAME[name]


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
    return backend == "auto" or runtime(backend).builds is not None or quantize != "none"
