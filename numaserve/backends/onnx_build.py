"""ONNX Runtime artifacts: exported, graph-optimised and quantised once, kept on disk, and
shared by every worker that serves the same model with the same options.

An artifact lives at CACHE/onnx/KEY/model.onnx, where KEY hashes the model's files, the
options and the ONNX Runtime version that optimised it. Not torch's: a runtime without torch
(the container image) must find what a build stage with torch exported, and another torch
exports an equivalent graph. The first worker to start builds it under a lock;
the others wait and load it. It is written to a temporary file and renamed into place, with
its SHA-256 beside it: a worker that finds a file that does not match (a crash mid-copy, a
full disk) says so and rebuilds it.

The build runs in a child process (`python -m numaserve.backends.onnx_build`) that inherits the
worker's CPUs and memory policy: export loads the torch model, and a worker that built in
process kept 2 GB it never used again; the child gives it all back when it exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

from numaserve import exitcodes
from numaserve.backends.base import ModelFacts, uses_token_types
from numaserve.backends.precision import kept_in_fp32, onnx_module_path
from numaserve.config import ModelConfig
from numaserve.lifecycle import die_with_parent
from numaserve.modelpath import ModelLoadError
from numaserve.tasks import TASKS

log = logging.getLogger(__name__)
FORMAT = 1  # bump when the build steps change, so old artifacts are not reused
OPSET = 17
INSTALL_HINT = (
    "model.backend onnxruntime needs the onnxruntime package, a numaserve dependency that is "
    "missing here: reinstall numaserve, or set model.backend: torch"
)


def cache_root() -> Path:
    """$NUMASERVE_CACHE, else systemd's CacheDirectory ($CACHE_DIRECTORY), else XDG's."""
    if root := os.environ.get("NUMASERVE_CACHE"):
        return Path(root)
    if root := os.environ.get("CACHE_DIRECTORY"):
        return Path(root.split(":")[0])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "numaserve"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def model_digest(model_dir: Path) -> str:
    """The checkpoint's files, names and contents: what an artifact or a choice was made of."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode() + b"\0")
        digest.update(_sha256(path).encode())
    return digest.hexdigest()


def artifact_key(model_dir: Path, config: ModelConfig, full_range: bool) -> str:
    digest = hashlib.sha256(model_digest(model_dir).encode())
    options = {
        "format": FORMAT,
        "task": config.task,
        "quantize": config.quantize,
        "full_range": full_range,
        "opset": OPSET,
        # From package metadata: importing it would cost the worker memory it never uses.
        "onnxruntime": importlib.metadata.version("onnxruntime"),
    }
    if uses_token_types(TASKS[config.task], ModelFacts.read(model_dir).type_vocab_size):
        options["token_type_ids"] = True  # an input of the graph (the key of others is as it was)
    if config.quantize == "int8" and config.keep_fp32:
        options["keep_fp32"] = sorted(config.keep_fp32)
    digest.update(json.dumps(options, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def ensure_artifact(
    model_dir: Path, config: ModelConfig, full_range: bool, root: Path | None = None
) -> Path:
    """The artifact's path, built first if it is missing or does not match its digest."""
    key = artifact_key(model_dir, config, full_range)
    directory = (root or cache_root()) / "onnx" / key
    artifact, digest = directory / "model.onnx", directory / "model.onnx.sha256"
    if _verified(artifact, digest):  # no lock, no write: a read-only cache serves
        return artifact
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = (directory / ".lock").open("w")
    except OSError as e:
        raise ModelLoadError(
            f"the ONNX artifact {artifact} is missing or damaged, and it cannot be built "
            f"there: {e.strerror}. Run `numaserve prepare --config FILE` where the cache is "
            "writable, or point NUMASERVE_CACHE at a writable directory"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait, then load its file
        if artifact.exists():
            if _verified(artifact, digest):
                return artifact
            log.warning("ONNX artifact %s does not match its digest: rebuilding it", artifact)
        _remove_leftovers(directory)
        log.info("building the ONNX artifact for %s in %s", config.path, directory)
        built = directory / f"model.onnx.{os.getpid()}.tmp"
        _build_in_child(config, full_range, built)
        _write_atomically(digest, _sha256(built))
        os.replace(built, artifact)
        return artifact


def _verified(artifact: Path, digest: Path) -> bool:
    """Complete: a builder writes the digest and then renames the artifact into place, so a
    file that matches its digest was finished, whoever reads it and whether locked or not."""
    try:
        return artifact.is_file() and digest.read_text().strip() == _sha256(artifact)
    except OSError:
        return False


def _remove_leftovers(directory: Path) -> None:
    """What a build killed midway left behind. Only lock holders build, and we hold it."""
    for path in directory.glob("build-*"):
        shutil.rmtree(path, ignore_errors=True)
    for path in directory.glob("*.tmp"):
        path.unlink(missing_ok=True)


def _build_in_child(config: ModelConfig, full_range: bool, output: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "numaserve.backends.onnx_build",
        json.dumps(dataclasses.asdict(config)),
        str(output),
        f"--parent={os.getpid()}",
    ] + (["--full-range"] if full_range else [])
    child = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if child.returncode == 0 and output.is_file():
        return
    output.unlink(missing_ok=True)
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    if child.returncode < 0:
        reason = f"the build process was killed by {exitcodes.signal_name(-child.returncode)}"
    else:
        reason = lines[-1] if lines else f"the build process exited {child.returncode}"
    if lines:
        log.error("the ONNX build's output:\n%s", "\n".join(lines[-40:]))
    raise ModelLoadError(reason)


def _write_atomically(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:
        f.write(text)
    os.replace(f.name, path)


def fp32_nodes(graph_path: Path, model, keep_fp32) -> list[str]:
    """The names of the graph's MatMul and Gemm nodes that compute the Linear layers
    `keep_fp32` names, for the quantizer to leave alone (none without it: the graph is not
    read)."""
    if not keep_fp32:
        return []
    import onnx

    from numaserve.backends.torch import linear_layers

    kept = kept_in_fp32(linear_layers(model), keep_fp32)
    nodes = {
        node.name: onnx_module_path(node.name)
        for node in onnx.load(str(graph_path)).graph.node
        if node.op_type in ("MatMul", "Gemm")
    }
    lost = kept - set(nodes.values())
    if lost:
        raise ModelLoadError(
            f"model.keep_fp32: the optimized ONNX graph has no MatMul left for "
            f"{', '.join(sorted(lost)[:3])} (fused into another operator); "
            "serve it with model.backend: torch"
        )
    # The quantizer first turns each Gemm into a MatMul named after it, plus "_MatMul".
    excluded = [name for name, path in nodes.items() if path in kept]
    return excluded + [f"{name}_MatMul" for name in excluded]


def build(model, config: ModelConfig, full_range: bool, destination: Path) -> None:
    """Export (dynamic batch and sequence axes), optimise, and quantise when asked. Its
    errors are reported by main(), the one place that words them."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    output = "logits" if TASKS[config.task].output.logits else "last_hidden_state"
    inputs = ["input_ids", "attention_mask"]
    if uses_token_types(TASKS[config.task], getattr(model.config, "type_vocab_size", 0) or 0):
        inputs.append("token_type_ids")  # a pair's second text has type 1

    class Outputs(torch.nn.Module):  # one tensor out, named for what the task reads
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            out = self.model(**dict(zip(inputs, tensors, strict=True)))
            return getattr(out, output)

    work = Path(tempfile.mkdtemp(dir=destination.parent, prefix="build-"))
    exported, optimized, quantized = work / "export.onnx", work / "opt.onnx", work / "int8.onnx"
    example = tuple(torch.ones((1, 8), dtype=torch.long) for _ in inputs)
    axes = {0: "batch", 1: "sequence"}
    logging.disable(logging.INFO)  # onnxruntime's tools log every tensor at INFO, on root
    try:
        with warnings.catch_warnings():  # the tracer's notes on code paths it fixed as traced
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Outputs().eval(),
                example,
                str(exported),
                input_names=inputs,
                output_names=[output],
                dynamic_axes={name: axes for name in [*inputs, output]},
                opset_version=OPSET,
                dynamo=False,
            )
        # num_heads/hidden_size 0: read from the graph.
        optimizer.optimize_model(
            str(exported), model_type="bert", num_heads=0, hidden_size=0
        ).save_model_to_file(str(optimized))
        result = optimized
        if config.quantize == "int8":
            quantize_dynamic(
                str(optimized),
                str(quantized),
                nodes_to_exclude=fp32_nodes(optimized, model, config.keep_fp32),
                weight_type=QuantType.QInt8,
                per_channel=True,  # per-channel scales, as the torch backend uses
                reduce_range=not full_range,  # 7-bit weights where int16 sums would saturate
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
            result = quantized
        os.replace(result, destination)
    finally:
        logging.disable(logging.NOTSET)
        shutil.rmtree(work)


def main(argv: list[str] | None = None) -> int:
    """The build child: ensure_artifact runs it and reads its last stderr line on failure."""
    parser = argparse.ArgumentParser(prog="python -m numaserve.backends.onnx_build")
    parser.add_argument("config", help="the model config, as JSON")
    parser.add_argument("output", type=Path)
    parser.add_argument("--parent", type=int, help="die with this process")
    parser.add_argument("--full-range", action="store_true", help="8-bit int8 activations")
    args = parser.parse_args(argv)
    if args.parent:  # a build whose worker was killed (a start timeout, a stop) must not go on
        die_with_parent(args.parent, signal.SIGKILL)
    config = ModelConfig(**json.loads(args.config))
    try:
        from numaserve.backends.torch import load_transformers_model

        build(load_transformers_model(config), config, args.full_range, args.output)
    except ModelLoadError as e:
        print(e, file=sys.stderr)
        return 1
    except Exception as e:  # the traceback for the log, then the one line the worker reports
        traceback.print_exc()
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"cannot export {config.path} to ONNX ({type(e).__name__}: {first_line}); "
            "serve it with model.backend: torch",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
