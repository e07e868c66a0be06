"""One copy of an ONNX Runtime model's weights per NUMA node, mapped by every instance on it.

A session on a whole `model.onnx` holds its weights twice over, privately: the file's
initializers read into its heap, and each weight again packed for the CPU's matrix kernels.
Eight instances of a Qwen3-Embedding-0.6B-shaped int8 model held 5.5 GB (PSS) so, and
1.2 GB mapping one copy (docs/benchmarks.md). So:

1. `packed_form` (run by `numaserve prepare`) has ONNX Runtime save the artifact once more (in
   a child process, which also checks that the form runs and answers as the artifact does): the
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
import sys
from dataclasses import dataclass
from pathlib import Path

from numaserve.backends.artifacts import kept_or_made, run_child
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.processes.prepared import write_atomically

log = logging.getLogger("numaserve.backends")
GRAPH = "model.onnx"
DATA = "model.onnx.data"  # where the graph says its initializers are, beside it
SIZES = "sizes"  # the pair's byte sizes, written last: a form or copy without it is unfinished
REFUSED = "refused"  # why a packed form could not be kept: its artifact serves whole


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

    def kept() -> Path | None:
        if (directory / REFUSED).exists():  # ONNX Runtime could not run it: said once, kept
            raise ModelLoadError((directory / REFUSED).read_text())
        return _complete(directory)

    def make() -> Path:
        try:
            _pack(artifact, directory)
        except ModelLoadError as e:
            write_atomically(directory / REFUSED, str(e))
            raise
        return directory / GRAPH

    def cannot(e: OSError) -> ModelLoadError:
        return ModelLoadError(
            f"cannot write the packed form of {artifact} in {directory}: {e.strerror}"
        )

    try:
        return kept_or_made(directory, ".lock", kept, make, cannot)
    except ModelLoadError as e:
        log.warning("%s: each instance will hold its own copy of the weights", e)
        return artifact


def _pack(artifact: Path, directory: Path) -> None:
    """The packed form, made and checked in a child process (`main`): ONNX Runtime 1.31 saved
    a packed form of a tied-embedding masked-LM graph that it then crashed running (SIGSEGV),
    so a form is kept only where it runs and answers as the artifact does."""
    work = directory / f"build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    child = run_child("numaserve.backends.node_weights", str(artifact), str(work))
    if child.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        why = child.failure("it")
        raise ModelLoadError(f"ONNX Runtime cannot run {artifact} with its weights mapped: {why}")
    for name in (DATA, GRAPH):
        os.replace(work / name, directory / name)
    work.rmdir()
    _seal(directory)


def _save_packed(artifact: Path, work: Path) -> None:
    """ONNX Runtime's own save of the optimised graph, its weights mapped-ready and packed."""
    import onnxruntime as ort

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
    ort.InferenceSession(str(artifact), options, providers=["CPUExecutionProvider"])


def _answers(graph: Path):
    """A session's output on a probe batch (two texts, one padded; ids every vocabulary has)."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=np.int64)
    given = {
        "input_ids": np.array([[1, 5, 17, 42, 2], [1, 9, 2, 0, 0]], dtype=np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros_like(mask),
    }
    return session.run(None, {i.name: given[i.name] for i in session.get_inputs()})[0]


def main(argv: list[str] | None = None) -> int:
    """The child `_pack` runs: save the packed form of ARTIFACT in WORK, then run both on a
    probe batch; exit 1 with one line on stderr where they differ."""
    import argparse
    import signal

    import numpy as np
    import onnxruntime as ort

    from numaserve.processes.lifecycle import die_with_parent

    parser = argparse.ArgumentParser(prog="python -m numaserve.backends.node_weights")
    parser.add_argument("artifact", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--parent", type=int, help="die with this process")
    args = parser.parse_args(argv)
    if args.parent:
        die_with_parent(args.parent, signal.SIGKILL)
    ort.disable_telemetry_events()
    artifact, work = args.artifact, args.work
    _save_packed(artifact, work)
    expected, got = _answers(artifact), _answers(work / GRAPH)
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max() or 1)):
        print(
            f"its answers differ from the artifact's by {np.abs(got - expected).max()}",
            file=sys.stderr,
        )
        return 1
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
