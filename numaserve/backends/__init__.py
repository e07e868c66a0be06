"""The model runtimes: what turns token ids into embeddings or class probabilities.

Importing this package imports no runtime: `load_model` imports the backend it needs on
demand, after the worker has pinned itself (host/pinning.py), so the runtime's thread pools
inherit the binding, and an ONNX Runtime worker never imports torch (about 200 MB less per
instance). Nor does it import the code that chooses a model path (choice.py, the gate, the
race): `prepare_model` and `load_model` do, where they choose; an instance's `load_prepared`
(loading.py) loads what the prepared record names, and never reaches it. The router and the
HTTP fronts import only `tokenizer` from here. Its modules:

- the runtimes: `torch.py`, `onnx.py`, `openvino.py` (and `openvino_runtime.py`, OpenVINO
  loaded with its telemetry off), `ct2.py`; `base.py`, what they share; `banded.py`, a pool
  that runs more than one path, by length and by micro-batch size;
- what is built once and kept: `artifacts.py`, `onnx_build.py`, `openvino_build.py`,
  `ct2_build.py`; `node_weights.py`, one copy of the weights per NUMA node;
- choosing a path: `choice.py` (`quantize: auto`), `gate.py` (the accuracy gate), `race.py`
  (timing that holds against a busy neighbour), `precision.py` (`keep_fp32`), `target.py`
  (judging for another CPU: its kernels capped to the target's extensions);
- `loading.py`: an instance's model, as the prepared record names it, by the class its
  runtime's record (config/runtimes.py) names; `building.py`: a path's artifact, by the build
  its record names (prepare, `auto`'s judging, tune: never an instance);
- `tokenizer.py` and `wordpiece_memo.py`: texts to token ids, the same everywhere.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.backends.loading import held, load_path, load_prepared
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.paths import BatchedPath, ModelPath, PoolPath
from numaserve.config.schema import ModelConfig
from numaserve.processes.prepared import Prepared

if TYPE_CHECKING:
    from numaserve.backends.base import Model
    from numaserve.backends.choice import Band, Batching

__all__ = ["load_model", "load_prepared", "prepare_model"]

log = logging.getLogger("numaserve.backends")


def load_model(
    config: ModelConfig, isa: tuple[str, ...] = (), threads: int = 1, artifact: str | None = None
) -> Model:
    """The model for config.backend, running `threads` intra-op threads; `auto` settings
    decided first (backends/choice.py), for one pool over every length (a pool whose
    shorter texts run on another path gets a Banded model). `artifact`: the one `numaserve
    prepare` built for this path, loaded as it is. `model.choice` says why, where auto chose."""
    from numaserve.backends.building import artifact as built
    from numaserve.backends.choice import concrete

    config, choice = concrete(config, isa, load_model)
    model = load_path(config, isa, threads, artifact or built(config, isa))
    if choice:
        model = held(model, choice, isa, threads, build=lambda c: built(c, isa))
    model.choice = choice
    return model


def prepare_model(
    config: ModelConfig,
    isa: tuple[str, ...],
    pools: tuple[Band, ...] | None = None,
    batching: Batching | None = None,
) -> Prepared | None:
    """Resolve the model once for every instance (`numaserve prepare`): its checkpoint, each
    pool's paths (the `auto` choice, made if none is kept; a named precision other than fp32
    judged by the gate, to say what it costs here) and their artifacts (an ONNX graph or a
    CTranslate2 conversion, built or verified), so that this work (minutes for a large model
    on a slow CPU) runs before any instance starts, and never once per instance. `pools`: the
    pools' bands (choice.bands); by default one over every length; `batching`: how they are
    raced (choice.ALONE by default). None (logged) when the model cannot be prepared."""
    from numaserve.backends.artifacts import model_digest
    from numaserve.backends.building import prepare_artifact
    from numaserve.backends.choice import ALONE, Band, ensure_choice, named, named_cost

    started = time.monotonic()
    pools = pools or (Band("default", 0, config.max_length),)
    accuracy: dict[str, str] = {}
    try:
        directory = Path(resolve_model_path(config.path))
        digest = model_digest(directory)
        if config.quantize == "auto":
            choice = ensure_choice(config, isa, load_model, pools, batching or ALONE, digest=digest)
            chosen = {b.pool: choice.pools[b.pool] for b in pools}
            judged = None
        else:
            judged = named(config)
            path = ModelPath(judged.backend, judged.quantize, judged.keep_fp32)
            chosen = {b.pool: PoolPath(path) for b in pools}
        # Built (or refused: a precision this CPU lacks) before a named one is judged, which
        # runs the fp32 reference over the gate's texts first.
        built: dict[ModelPath, str | None] = {}
        for pool in chosen.values():
            for p in pool.held:
                if p not in built:
                    built[p] = prepare_artifact(p.applied_to(config), isa, digest)
        if judged is not None and judged.quantize != "none":
            accuracy = named_cost(judged, isa, pools, load_model, digest)
    except ModelLoadError as e:
        log.error("fatal: %s", e, extra={"event": "fatal"})
        return None
    record = Prepared(
        config.path,
        str(directory),
        digest,
        {pool: _built(c, built, accuracy.get(pool) or c.accuracy) for pool, c in chosen.items()},
    )
    _log_prepared(config, record)
    log.info("prepared in %.1f s", time.monotonic() - started, extra={"event": "prepare"})
    return record


def _log_prepared(config: ModelConfig, record: Prepared) -> None:
    """What prepare resolved for each pool: its path, its shorter texts' and its
    micro-batches', each with why."""
    for pool, entry in record.pools.items():
        log.info(
            "prepared %s, pool %s: %s (%s)%s",
            config.path,
            pool,
            entry.path,
            f"auto: {entry.why}" if entry.why else "as the config names it",
            f", artifact {entry.artifact}" if entry.artifact else "",
            extra={"event": "prepare"},
        )
        for band in entry.shorter:
            log.info(
                "prepared %s, pool %s, texts of up to %d tokens: %s (auto: %s)",
                config.path,
                pool,
                band.last,
                band.path,
                band.why,
                extra={"event": "prepare"},
            )
        for band in (entry, *entry.shorter):
            if band.batched:
                log.info(
                    "prepared %s, pool %s, the micro-batches of %s: %s (auto: %s)",
                    config.path,
                    pool,
                    f"texts of up to {band.last} tokens" if band is not entry else "its own texts",
                    band.batched.words(),
                    band.batched.why,
                    extra={"event": "prepare"},
                )


def _built(chosen: PoolPath, built: dict, accuracy: str | None) -> PoolPath:
    """A pool's choice as prepare records it: with the artifact it built for each path."""

    def batched(b: BatchedPath | None) -> BatchedPath | None:
        return b and dataclasses.replace(b, artifact=built[b.path])

    shorter = tuple(
        dataclasses.replace(s, artifact=built[s.path], batched=batched(s.batched))
        for s in chosen.shorter
    )
    return dataclasses.replace(
        chosen,
        artifact=built[chosen.path],
        shorter=shorter,
        batched=batched(chosen.batched),
        accuracy=accuracy,
    )
