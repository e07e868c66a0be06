"""sentence-transformers' own fastest CPU paths, for benchmarks/embedders.py, one thread:

- `onnx`: its ONNX backend (optimum's export) running the int8 model its
  `export_dynamic_quantized_onnx_model` makes for this CPU (`avx512_vnni`, else `avx2`), or its
  fp32 export. In .peers/st-onnx (install.sh): optimum-onnx needs transformers < 4.58.
- `openvino`: its OpenVINO backend (optimum-intel's export) running the int8 model its
  `export_static_quantized_openvino_model` makes (post-training static quantization,
  calibrated on the texts of the first line it is sent: its default calibration set is on the
  Hugging Face Hub, which this machine cannot reach), or its fp32 export. In
  .peers/st-openvino (install.sh): optimum-intel needs transformers < 5.6.

Usage: python st_backend.py onnx|openvino CPU CHECKPOINT [int8|fp32]: the model it times
(int8 by default). Pins itself to CPU, copies the checkpoint, exports and quantizes, then says
`ready` with the cosines (lowest, median) of its int8 to its fp32 and of each to
sentence-transformers' own torch model, on the texts of the first line it is sent; then, for each line (a JSON list of texts), encodes them one by one and prints the ms a
text. A checkpoint it cannot export or run: one line, `cannot: why`, and exit 3.
"""

import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
# stdout is this script's answers alone: anything the libraries print (NNCF's progress bars)
# goes to stderr, the answers to a copy of the original stdout.
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
backend, cpu, given = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
timed = sys.argv[4] if len(sys.argv) > 4 else "int8"
os.sched_setaffinity(0, {cpu})
path = tempfile.mkdtemp(prefix=f"st-{backend}-")
atexit.register(shutil.rmtree, path, ignore_errors=True)  # its exports: gigabytes a model
shutil.copytree(given, path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("onnx"))
from sentence_transformers import SentenceTransformer  # noqa: E402


def onnx(first: list[str]):
    """Its fp32 export and the dynamic int8 model it quantizes for this CPU."""
    import onnxruntime as ort
    from sentence_transformers import export_dynamic_quantized_onnx_model

    # sentence-transformers 5 names the modules sentence_transformers.models.X (the
    # checkpoint was saved by numaserve's sentence-transformers 6, as the published ones are)
    modules = json.loads((given / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[1]
    Path(path, "modules.json").write_text(json.dumps(modules))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    kwargs = {"provider": "CPUExecutionProvider", "session_options": options}
    fp32 = SentenceTransformer(path, backend="onnx", device="cpu", model_kwargs=kwargs)
    config = "avx512_vnni" if "avx512_vnni" in Path("/proc/cpuinfo").read_text() else "avx2"
    export_dynamic_quantized_onnx_model(fp32, config, path)
    name = f"onnx/model_qint8_{config}.onnx"
    int8 = SentenceTransformer(
        path, backend="onnx", device="cpu", model_kwargs={**kwargs, "file_name": name}
    )
    return fp32, int8, {"quantized_for": config}


def openvino(first: list[str]):
    """Its fp32 export and the static int8 model it calibrates on `first`."""
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers import export_static_quantized_openvino_model

    kwargs = {"ov_config": {"INFERENCE_NUM_THREADS": "1", "PERFORMANCE_HINT": "LATENCY"}}
    exported = SentenceTransformer(path, backend="openvino", device="cpu", model_kwargs=kwargs)
    exported.save(path)  # its fp32 IR, openvino/openvino_model.xml
    calibration = Path(path) / "calibration"
    calibration.mkdir()
    lines = "".join(json.dumps({"text": text}) + "\n" for text in first)
    (calibration / "train.jsonl").write_text(lines)
    export_static_quantized_openvino_model(
        exported,
        OVQuantizationConfig(num_samples=len(first)),
        path,
        dataset_name=str(calibration),
        dataset_config_name="default",
        dataset_split="train",
        column_name="text",
    )
    # The quantizer replaces the model it is given by its int8 one, in place: the fp32 side
    # is loaded again from the IR saved before.
    del exported
    fp32, int8 = (
        SentenceTransformer(
            path, backend="openvino", device="cpu", model_kwargs={**kwargs, "file_name": name}
        )
        for name in (
            "openvino/openvino_model.xml",
            "openvino/openvino_model_qint8_quantized.xml",
        )
    )
    return fp32, int8, {"quantized": "static, calibrated on the probe texts"}


first = json.loads(sys.stdin.readline())
try:
    fp32, int8, said = {"onnx": onnx, "openvino": openvino}[backend](first)
    a = fp32.encode(first, normalize_embeddings=True)
    b = int8.encode(first, normalize_embeddings=True)
except Exception as e:  # it cannot export the model, or cannot run its export as ST calls it
    print("cannot:", f"{type(e).__name__}: {str(e).strip().splitlines()[0]}", file=answers)
    answers.flush()
    sys.exit(3)
# Each export against sentence-transformers' own torch model on the same texts: an export
# that computes something else (an attention made causal) is fast and wrong.
torch_model = SentenceTransformer(path, device="cpu")
reference = torch_model.encode(first, normalize_embeddings=True)
del torch_model


def cosines(x, y) -> dict:
    values = [float(u @ v) for u, v in zip(x, y, strict=True)]
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4)}


said["int8_to_fp32"] = cosines(a, b)
said["fp32_to_torch"] = cosines(a, reference)
said["int8_to_torch"] = cosines(b, reference)
print("ready", json.dumps(said), file=answers, flush=True)
model = int8 if timed == "int8" else fp32
for line in sys.stdin:
    texts = json.loads(line)
    started = time.perf_counter()
    for text in texts:
        model.encode([text])
    print((time.perf_counter() - started) * 1000 / len(texts), file=answers, flush=True)
