"""sentence-transformers' own fastest CPU path, for benchmarks/embedders.py: its ONNX backend
(optimum's export) running the int8 model its `export_dynamic_quantized_onnx_model` makes for
this CPU (`avx512_vnni`, else `avx2`), one thread. It runs in a venv of its own
(.peers/st-onnx, install.sh): optimum-onnx needs transformers < 4.58.

Usage: python st_onnx.py CPU CHECKPOINT [int8|fp32]: the model it times (int8 by default; its
fp32 ONNX export, the one its int8 is judged against, with fp32). Pins itself to CPU, copies the checkpoint (its
modules named as sentence-transformers 5 and the published checkpoints name them: the
checkpoint was saved by numaserve's sentence-transformers 6), exports and quantizes, then says
`ready` with its int8's cosine to its own fp32 ONNX model on the texts of the first line it is
sent; then, for each line (a JSON list of texts), encodes them one by one and prints the ms a
text. A checkpoint optimum cannot export: one line, `cannot: why`, and exit 3.
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

cpu, given = int(sys.argv[1]), Path(sys.argv[2])
timed = sys.argv[3] if len(sys.argv) > 3 else "int8"
os.sched_setaffinity(0, {cpu})
path = tempfile.mkdtemp(prefix="st-onnx-")
shutil.copytree(given, path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("onnx"))
modules = json.loads((given / "modules.json").read_text())
for module in modules:  # sentence_transformers.base.modules.normalize.Normalize: .models.Normalize
    module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[1]
Path(path, "modules.json").write_text(json.dumps(modules))
import onnxruntime as ort  # noqa: E402
from sentence_transformers import (  # noqa: E402
    SentenceTransformer,
    export_dynamic_quantized_onnx_model,
)

options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
kwargs = {"provider": "CPUExecutionProvider", "session_options": options}
first = json.loads(sys.stdin.readline())
try:
    fp32 = SentenceTransformer(path, backend="onnx", device="cpu", model_kwargs=kwargs)
    flags = Path("/proc/cpuinfo").read_text()
    config = "avx512_vnni" if "avx512_vnni" in flags else "avx2"
    export_dynamic_quantized_onnx_model(fp32, config, path)
    int8 = SentenceTransformer(
        path,
        backend="onnx",
        device="cpu",
        model_kwargs={**kwargs, "file_name": f"onnx/model_qint8_{config}.onnx"},
    )
    a = fp32.encode(first, normalize_embeddings=True)
    b = int8.encode(first, normalize_embeddings=True)
except Exception as e:  # optimum cannot export it, or its export cannot run as ST calls it
    print("cannot:", f"{type(e).__name__}: {str(e).strip().splitlines()[0]}", flush=True)
    sys.exit(3)
cosines = [float(x @ y) for x, y in zip(a, b, strict=True)]
said = {"quantized_for": config, "cosine_min": round(min(cosines), 4)}
said["cosine_median"] = round(statistics.median(cosines), 4)
print("ready", json.dumps(said), flush=True)
model = int8 if timed == "int8" else fp32
for line in sys.stdin:
    texts = json.loads(line)
    started = time.perf_counter()
    for text in texts:
        model.encode([text])
    print((time.perf_counter() - started) * 1000 / len(texts), flush=True)
