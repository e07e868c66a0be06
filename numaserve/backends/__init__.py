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
- `loading.py`: an instance's model, as the prepared record names it;
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
from numaserve.config.schema import ModelConfig
from numaserve.processes.prepared import BandPath, BatchedPath, ModelPath, PoolPath, Prepared

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
    from numaserve.backends.choice import concrete

    config, choice = concrete(config, isa, load_model)
    model = load_path(config, isa, threads, artifact)
    if choice:
        model = held(model, choice, isa, threads)
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
    from numaserve.backends.choice import ALONE, Band, PoolChoice, ensure_choice, named, named_cost

    started = time.monotonic()
    pools = pools or (Band("default", 0, config.max_length),)
    accuracy: dict[str, str] = {}
    try:
        directory = Path(resolve_model_path(config.path))
        digest = model_digest(directory)
        if config.quantize == "auto":
            choice = ensure_choice(config, isa, load_model, pools, batching or ALONE, digest=digest)
            chosen = {b.pool: choice.pools[b.pool] for b in pools}
        else:
            c = named(config)
            path = ModelPath(c.backend, c.quantize, c.keep_fp32)
            chosen = {b.pool: PoolChoice(path, None) for b in pools}
            if c.quantize != "none":
                accuracy = named_cost(c, isa, pools, load_model, digest)
        built: dict[ModelPath, str | None] = {}
        for c in chosen.values():
            bands = (c, *c.shorter)
            for p in (*(b.path for b in bands), *(b.batched.path for b in bands if b.batched)):
                if p not in built:
                    built[p] = _prepare_artifact(p.applied_to(config), isa, digest)
    except ModelLoadError as e:
        log.error("fatal: %s", e, extra={"event": "fatal"})
        return None
    record = Prepared(
        config.path,
        str(directory),
        digest,
        {
            pool: PoolPath(
                c.path,
                built[c.path],
                c.why,
                tuple(
                    BandPath(
                        s.last, s.path, built[s.path], s.why, _built(s.batched, built), s.accuracy
                    )
                    for s in c.shorter
                ),
                accuracy.get(pool) or c.accuracy,
                _built(c.batched, built),
            )
            for pool, c in chosen.items()
        },
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


def _built(batched: BatchedPath | None, built: dict) -> BatchedPath | None:
    """A band's micro-batches' path as prepare records it: with the artifact it built."""
    return batched and dataclasses.replace(batched, artifact=built[batched.path])


def _prepare_artifact(config: ModelConfig, isa: tuple[str, ...], digest: str) -> str | None:
    """The path's artifact, built or verified: None for torch, which loads the checkpoint."""
    if config.backend == "torch":
        return None
    what = {"ctranslate2": "CTranslate2 model", "openvino": "OpenVINO model"}.get(
        config.backend, "ONNX artifact"
    )
    log.info(
        "preparing the %s of %s (built once and kept; a first build takes a while)",
        what,
        config.path,
        extra={"event": "prepare"},
    )
    started = time.monotonic()
    if config.backend == "ctranslate2":
        from numaserve.backends.ct2 import prepare_converted

        artifact, _ = prepare_converted(config, digest)
    elif config.backend == "openvino":
        from numaserve.backends.openvino import inference_precision, prepare_model
        from numaserve.backends.openvino_runtime import import_openvino

        inference_precision(config, isa)  # a CPU without bf16 fails here, not per instance
        import_openvino()
        artifact, _ = prepare_model(config, isa, digest)
    else:
        from numaserve.backends.node_weights import packed_form
        from numaserve.backends.onnx import prepare_artifact

        artifact, _ = prepare_artifact(config, isa, digest)
        artifact = packed_form(artifact)  # its weights mapped, shared (node_weights.py)
    log.info(
        "%s ready in %.1f s: %s",
        what,
        time.monotonic() - started,
        artifact,
        extra={"event": "prepare"},
    )
    return str(artifact)
