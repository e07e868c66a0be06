"""One measuring process: the model alone, pinned and memory bound as an instance is, timing a
forward pass for each batch size and length. `measure.py` starts it; it prints each
measurement as a JSON line (a curves.Cell) as soon as it has it.

Each cell is timed twice: warm (the same shape again and again) and cold (each pass a
(texts, tokens) shape this process has not run before, at lengths just under the cell's).
OpenVINO compiles kernels per input shape and keeps a few (backends/openvino.py): a shape it
has not kept costs about twice a kept one's time on MiniLM, so traffic of many lengths runs
at the cold figure; ONNX Runtime's two figures agree.

Batches go outermost, shortest lengths first, so that a probe cut short by its time budget
leaves whole length curves for the batch sizes it finished. No pass bigger than
MAX_PASS_TOKENS runs (no max_batch_tokens tune writes needs one), nor any larger batch at a
length whose pass already took SLOW_PASS_S.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from numaserve.host.cpuset import Binding
from numaserve.host.pinning import thread_settings
from numaserve.processes import exitcodes
from numaserve.processes.begin import begin
from numaserve.processes.specs import JSONSpec

log = logging.getLogger("numaserve.tune.probe")
MAX_PASS_TOKENS = 2048  # texts x padded length in one pass
SLOW_PASS_S = 1.0
MIN_CELL_S = 0.15  # time each cell at least this long (and at least MIN_PASSES passes)
MIN_PASSES, MAX_PASSES = 3, 15


@dataclass(frozen=True)
class ProbeSpec(JSONSpec):
    module = "numaserve.tune.probe"

    model: ModelConfig  # with its backend and precision named (the path measured)
    path: str  # that path as processes.prepared.ModelPath spells it
    binding: Binding  # the slot's, as an instance's
    lengths: tuple[int, ...]
    batches: tuple[int, ...]
    seconds: float  # the time budget, after the model loads
    isa: tuple[str, ...] = ()


def timed(run, batch: list[list[int]]) -> float:
    """The median of several passes, after one untimed pass (a new shape's first is slower)."""
    run(batch)
    times: list[float] = []
    while len(times) < MIN_PASSES or (sum(times) < MIN_CELL_S and len(times) < MAX_PASSES):
        began = time.perf_counter()
        run(batch)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def cold(run, texts, length: int, seen: set[tuple[int, int]]) -> float:
    """The median of passes each at a shape not run before, the nearest under `length`."""
    times = []
    for cut in range(length, 0, -1):
        if len(times) == MIN_PASSES:
            break
        if (len(texts), cut) in seen:
            continue
        seen.add((len(texts), cut))
        batch = [ids[:cut] for ids in texts]
        began = time.perf_counter()
        run(batch)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure(spec: ProbeSpec, model, emit) -> None:
    rng = random.Random(0)
    low, high = min(1000, model.vocab_size - 1), model.vocab_size - 1
    seen: set[tuple[int, int]] = set()  # (texts, tokens) shapes run so far
    deadline = time.monotonic() + spec.seconds
    slow_from: dict[int, int] = {}  # length: the batch size whose pass was too slow
    for batch in spec.batches:
        for length in spec.lengths:
            if length * batch > MAX_PASS_TOKENS or batch > slow_from.get(length, batch):
                continue
            if time.monotonic() > deadline:
                log.warning("time budget spent: batch %d and larger not measured", batch)
                return
            texts = [[rng.randint(low, high) for _ in range(length)] for _ in range(batch)]
            seen.add((batch, length))
            seconds = timed(model.run, texts)
            cold_seconds = cold(model.run, texts, length - 1, seen)
            if seconds > SLOW_PASS_S:
                slow_from[length] = batch
            emit(
                {
                    "path": spec.path,
                    "cores": len(spec.binding.cpus),
                    "length": length,
                    "batch": batch,
                    "seconds": seconds,
                    "cold_seconds": cold_seconds,
                }
            )


def main(argv: list[str] | None = None) -> int:
    began = begin(ProbeSpec, argv, log, parent=os.getppid())
    if isinstance(began, int):
        return began
    spec = began.spec
    threads, _ = thread_settings(len(spec.binding.cpus), os.environ)
    from numaserve.backends import load_model  # imports the runtime: after pinning

    try:
        model = load_model(spec.model, spec.isa, threads)
    except ModelLoadError as e:
        log.error("%s", e)
        return exitcodes.MODEL

    def emit(cell: dict) -> None:
        print(json.dumps(cell), flush=True)

    measure(spec, model, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
