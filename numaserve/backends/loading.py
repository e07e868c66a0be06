"""An instance's model, loaded as `numaserve prepare` resolved it (processes/prepared.py's
record: each pool's path and artifact), with no hashing, judging or choosing: nothing here
imports the code that chooses (choice.py), nor a runtime before the path names it."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from numaserve.checkpoint.errors import MissingRuntime
from numaserve.config.runtimes import runtime
from numaserve.config.schema import ModelConfig
from numaserve.processes.prepared import Prepared

if TYPE_CHECKING:
    from numaserve.backends.base import Model

Build = Callable[[ModelConfig], "str | None"]  # a path's artifact, built where missing

log = logging.getLogger("numaserve.worker")


def load_path(
    config: ModelConfig,
    isa: tuple[str, ...],
    threads: int,
    artifact: str | None,
    node: int | None = None,
) -> Model:
    """The model of one named path, from the artifact prepare built (config/runtimes.py's
    record says which class loads it); `node`: the NUMA node whose copy of shared weights
    it maps, where it is bound to one."""
    record = runtime(config.backend)
    try:
        from numaserve.backends.base import Load  # numpy: imported once the process is pinned

        return named_in_backends(record.loads)(Load(config, isa, threads, artifact, node))
    except ModuleNotFoundError as e:
        raise MissingRuntime(
            f"model.backend {config.backend} cannot run here: {e} (installed without it, as "
            "the container image is without torch). Install numaserve with its dependencies, "
            "or name a backend this installation has"
        ) from e


def named_in_backends(reference: str):
    """`module:name` of a runtime's record, imported only now: a process loads no runtime
    but the one it runs."""
    module, name = reference.split(":")
    return getattr(importlib.import_module(f"numaserve.backends.{module}"), name)


def held(main, entry, isa, threads: int, node: int | None = None, build: Build | None = None):
    """The pool's model: `main` (its own path, loaded) where `entry` (a prepared PoolPath, or
    a choice's, where `auto` chose in this process) names no other path; else a Banded that
    holds each of the entry's paths once: its shorter bands' and each band's micro-batches'.
    `build`: where `auto` chose in this process, what makes a path's artifact (a choice names
    none); an instance has its artifacts from prepare, and builds nothing."""
    from numaserve.backends.banded import Banded, Segment
    from numaserve.config.paths import ModelPath

    config = main.config
    own = ModelPath(config.backend, config.quantize, config.keep_fp32)
    loaded = {own: main}

    def load(path: ModelPath, artifact: str | None):
        if path not in loaded:
            path_config = path.applied_to(config)
            if artifact is None and build is not None:
                artifact = build(path_config)
            loaded[path] = load_path(path_config, isa, threads, artifact, node)
        return loaded[path]

    def segment(last: int | None, band) -> Segment:
        alone = load(band.path, getattr(band, "artifact", None))  # a choice's has none
        if band.batched is None:
            return Segment(last, alone)
        batched = load(band.batched.path, band.batched.artifact)
        return Segment(last, alone, batched, band.batched.from_batch)

    segments = [*(segment(b.last, b) for b in entry.shorter), segment(None, entry)]
    if len(loaded) == 1:
        return main
    return Banded(segments, {id(m): str(p) for p, m in loaded.items()})


def load_prepared(
    config: ModelConfig,
    pool: str,
    record: str,
    isa: tuple[str, ...],
    threads: int,
    node: int | None = None,
    digest: str = "",
) -> Model:
    """An instance's model: its pool's paths and artifacts as `numaserve prepare` resolved
    them (processes/prepared.py), loaded with no hashing, judging or choosing. `node`: the one
    NUMA node the instance is bound to, whose copy of shared weights it maps. `digest`: its
    pool's digest as its spec has it; a record prepared again since says so in the log."""
    prepared = Prepared.read(record)
    if digest and (now := prepared.pool_digest(pool)) != digest:
        log.warning(
            "%s was prepared again since this instance's spec was made (pool %s: digest %s, "
            "the spec's %s): it loads what the record says now; SIGHUP renews every instance",
            record,
            pool,
            now,
            digest,
            extra={"event": "load"},
        )
    config, entry = prepared.config_for(config, pool)
    model = held(load_path(config, isa, threads, entry.artifact, node), entry, isa, threads, node)
    model.prepared = entry
    model.accuracy = entry.accuracy
    return model
