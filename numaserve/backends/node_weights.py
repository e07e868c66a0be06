"""One copy of an ONNX Runtime model's weights per NUMA node, mapped by every instance on it.

A session on a whole `model.onnx` holds its weights twice over, privately: the file's
initializers read into its heap, and each weight again packed for the CPU's matrix kernels.
Eight instances of a Qwen3-Embedding-0.6B-shaped int8 model held 5.5 GB (PSS) so, and
1.2 GB mapping one copy (docs/benchmarks.md). So:

1. `packed_form` (run by `numaserve prepare`) has ONNX Runtime save the artifact once more: the
   graph in `model.onnx`, every initializer in `model.onnx.data` at page-aligned offsets, and
   with them the weights as this CPU's kernels pack them
   (`session.save_external_prepacked_constant_initializers`). ONNX Runtime maps such a file
   instead of reading it, and takes the packed weights from the map instead of packing its
   own, so a session's weights are pages of the file: shared by every process that maps it.
   Packing depends on the kernels ONNX Runtime picks for the CPU, so the form is keyed by the
   CPU's flags as well as the artifact and the ONNX Runtime version.
2. `node_copy` (run by each instance, which is already bound to its node): the first instance
   of a NUMA node copies that pair into `node<N>/` under the directory's lock, and every
   instance of the node maps that copy. Page-cache pages are allocated under the memory
   policy of the process that brings them in, and only instances bound to node N ever read
   node N's copy, so its pages sit on node N (read back there if the kernel evicts them):
   one copy per node, each local to the instances that use it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from numaserve.backends.artifacts import kept_or_made, write_atomically
from numaserve.config.model_paths import ModelLoadError

log = logging.getLogger("numaserve.backends")
GRAPH = "model.onnx"
DATA = "model.onnx.data"  # where the graph says its initializers are, beside it
SIZES = "sizes"  # the pair's byte sizes, written last: a form or copy without it is unfinished


@dataclass(frozen=True)
class Weights:
    """The weights file an instance maps, as status and the metrics report it."""

    file: str
    bytes: int
    node: int | None  # the NUMA node whose copy it is; None: one copy for the whole host

    def to_wire(self) -> dict:
        return {"file": self.file, "bytes": self.bytes, "node": self.node}


def is_packed(graph: Path) -> bool:
    """Whether an artifact is a packed form (its weights in a file beside it)."""
    return (graph.parent / DATA).exists() and graph.name == GRAPH


def cpu_flags() -> str:
    """The CPU's flags as the kernel lists them: what ONNX Runtime picks its kernels by, and so
    how it packs weights. Read here, not the `isa` a caller may force (a test, a build for
    another machine): packing runs on this CPU whatever that says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return value.strip()
    except OSError:
        pass
    return ""


def packed_form(artifact: Path) -> Path:
    """The artifact's packed form for this CPU, made first where it is missing: its graph's
    path, CACHE/onnx/KEY/packed-P/model.onnx, beside the artifact it was made of. Where it
    cannot be made (a read-only cache prepared on another CPU), the artifact itself, said in
    a warning: each instance then holds its own copy of the weights."""
    digest = (artifact.parent / f"{artifact.name}.sha256").read_text().strip()
    key = hashlib.sha256(
        "\0".join([digest, importlib.metadata.version("onnxruntime"), cpu_flags()]).encode()
    ).hexdigest()[:16]
    directory = artifact.parent / f"packed-{key}"

    def make() -> Path:
        _pack(artifact, directory)
        return directory / GRAPH

    def cannot(e: OSError) -> ModelLoadError:
        return ModelLoadError(
            f"cannot write the packed form of {artifact} in {directory}: {e.strerror}"
        )

    try:
        return kept_or_made(directory, ".lock", lambda: _complete(directory), make, cannot)
    except ModelLoadError as e:
        log.warning("%s: each instance will hold its own copy of the weights", e)
        return artifact


def _pack(artifact: Path, directory: Path) -> None:
    """ONNX Runtime's own save of the optimised graph, its weights mapped-ready and packed."""
    import onnxruntime as ort

    ort.disable_telemetry_events()
    work = directory / f"build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    # Extended, not all: the layout transforms of the last level are for convolutions, and
    # ONNX Runtime warns that a graph saved with them may not load elsewhere.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(work / GRAPH)
    for key, value in {
        "session.optimized_model_external_initializers_file_name": DATA,
        "session.optimized_model_external_initializers_min_size_in_bytes": "1024",
        "session.save_external_prepacked_constant_initializers": "1",
    }.items():
        options.add_session_config_entry(key, value)
    try:
        ort.InferenceSession(str(artifact), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        shutil.rmtree(work, ignore_errors=True)
        raise ModelLoadError(f"ONNX Runtime cannot re-save {artifact} packed: {e}") from None
    for name in (DATA, GRAPH):
        os.replace(work / name, directory / name)
    work.rmdir()
    _seal(directory)


def node_copy(graph: Path, node: int) -> Path:
    """The packed form's copy for NUMA node `node`, made by the calling process (bound to that
    node, so that the copy's pages are allocated there) if no instance of the node made it.
    Where it cannot be written (a read-only cache), the packed form itself, said in a
    warning: one copy for the whole host, its pages where they were first read."""
    source, directory = graph.parent, graph.parent / f"node{node}"

    def make() -> Path:
        for name in (DATA, GRAPH):
            shutil.copyfile(source / name, directory / f"{name}.tmp")
            os.replace(directory / f"{name}.tmp", directory / name)
        _seal(directory)
        log.info("copied the model's weights for NUMA node %d: %s", node, directory / DATA)
        return directory / GRAPH

    def cannot(e: OSError) -> ModelLoadError:
        return ModelLoadError(f"cannot copy the weights for NUMA node {node}: {e.strerror}")

    def kept() -> Path | None:
        found = _complete(directory)
        return found if found and _sizes(directory) == _sizes(source) else None

    try:
        return kept_or_made(directory, ".lock", kept, make, cannot)
    except ModelLoadError as e:
        log.warning("%s: this node's instances map one copy for the whole host", e)
        return graph


def weights_of(graph: Path) -> Weights:
    """The weights file a packed form or a node's copy of it (`node<N>/`) maps."""
    data, name = graph.parent / DATA, graph.parent.name
    node = int(name.removeprefix("node")) if name.startswith("node") else None
    return Weights(str(data), data.stat().st_size, node)


def _sizes(directory: Path) -> str:
    return " ".join(str((directory / name).stat().st_size) for name in (GRAPH, DATA))


def _seal(directory: Path) -> None:
    write_atomically(directory / SIZES, _sizes(directory))


def _complete(directory: Path) -> Path | None:
    """The pair's graph where both files are whole, as their sealed sizes say."""
    try:
        return directory / GRAPH if (directory / SIZES).read_text() == _sizes(directory) else None
    except OSError:
        return None
