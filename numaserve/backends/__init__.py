"""The model runtimes: what turns token ids into embeddings or class probabilities.

Importing this package imports no runtime: `load_model` imports the backend it needs on
demand, after the worker has pinned itself (host/pinning.py), so the runtime's thread pools
inherit the binding, and an ONNX Runtime worker never imports torch (about 200 MB less per
instance). The router imports only `tokenizer` from here.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from numaserve.backends.choice import concrete
from numaserve.config import ModelConfig
from numaserve.modelpath import ModelLoadError

if TYPE_CHECKING:
    from numaserve.backends.base import Model

log = logging.getLogger("numaserve.backends")


def load_model(config: ModelConfig, isa: tuple[str, ...] = (), threads: int = 1) -> Model:
    """The model for config.backend, running `threads` intra-op threads; `auto` settings
    decided first (backends/choice.py). `model.choice` says why, where auto chose."""
    config, choice = concrete(config, isa, load_model)
    if config.backend == "onnxruntime":
        from numaserve.backends.onnx import OnnxModel

        model = OnnxModel(config, isa, threads)
    elif config.backend == "openvino":
        from numaserve.backends.openvino import OpenVinoModel

        model = OpenVinoModel(config, isa, threads)
    elif config.backend == "ctranslate2":
        from numaserve.backends.ct2 import Ct2Model

        model = Ct2Model(config, isa, threads)
    else:
        from numaserve.backends.torch import TorchModel

        model = TorchModel(config, isa, threads)
    model.choice = choice
    return model


def prepare_model(config: ModelConfig, isa: tuple[str, ...]) -> bool:
    """Make the `auto` choice and build or verify the model's artifact (an ONNX graph or a
    CTranslate2 conversion: `numaserve prepare`), so that this work (minutes for a large
    model on a slow CPU) runs before any instance starts, and never once per instance. False
    (logged) when the model cannot be prepared."""
    started = time.monotonic()
    try:
        config, choice = concrete(config, isa, load_model)
        if choice is not None:
            log.info(
                "quantize: auto chose %s for %s: %s",
                choice.path,
                config.path,
                choice.why,
                extra={"event": "prepare"},
            )
        if config.backend == "torch":
            return True
        what = "CTranslate2 model" if config.backend == "ctranslate2" else "ONNX artifact"
        log.info(
            "preparing the %s of %s (built once and kept; a first build takes a while)",
            what,
            config.path,
            extra={"event": "prepare"},
        )
        artifact = _prepare_artifact(config, isa)
    except ModelLoadError as e:
        log.error("fatal: %s", e, extra={"event": "fatal"})
        return False
    log.info(
        "%s ready in %.1f s: %s",
        what,
        time.monotonic() - started,
        artifact,
        extra={"event": "prepare"},
    )
    return True


def _prepare_artifact(config: ModelConfig, isa: tuple[str, ...]):
    if config.backend == "ctranslate2":
        from numaserve.backends.ct2 import prepare_converted

        return prepare_converted(config)[0]
    from numaserve.backends.onnx import prepare_artifact
    from numaserve.backends.openvino import (
        fp32_artifact_config,
        import_openvino,
        inference_precision,
    )

    if config.backend == "openvino":
        inference_precision(config, isa)  # a CPU without bf16 fails here, not per instance
        import_openvino()
        config = fp32_artifact_config(config)
    artifact, _ = prepare_artifact(config, isa)
    return artifact
