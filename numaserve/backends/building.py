"""Artifacts built where a process chooses or prepares (`numaserve prepare`, `auto` judging
in process, tune): each runtime's build, as its record in config/runtimes.py names it. An
instance never imports this: it loads what prepare built (loading.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from numaserve.backends.loading import named_in_backends
from numaserve.config.runtimes import runtime
from numaserve.config.schema import ModelConfig

log = logging.getLogger("numaserve.backends")


def artifact(config: ModelConfig, isa: tuple[str, ...], digest: str | None = None) -> str | None:
    """The path's artifact, built now if missing or damaged (kept on disk: a second call
    finds it); None for a runtime that loads the checkpoint itself. `digest`: the
    checkpoint's, where the caller has it."""
    builds = runtime(config.backend).builds
    return None if builds is None else str(named_in_backends(builds)(config, isa, digest))


def prepare_artifact(config: ModelConfig, isa: tuple[str, ...], digest: str) -> str | None:
    """The artifact an instance will load, built or verified, said in the log: packed for
    this CPU where the runtime shares its weights per NUMA node (node_weights.py)."""
    record = runtime(config.backend)
    if record.builds is None:
        return None
    log.info(
        "preparing the %s of %s (built once and kept; a first build takes a while)",
        record.artifact,
        config.path,
        extra={"event": "prepare"},
    )
    started = time.monotonic()
    built = artifact(config, isa, digest)
    if record.shares_weights and built is not None:
        from numaserve.backends.node_weights import packed_form

        built = str(packed_form(Path(built)))
    log.info(
        "%s ready in %.1f s: %s",
        record.artifact,
        time.monotonic() - started,
        built,
        extra={"event": "prepare"},
    )
    return built
