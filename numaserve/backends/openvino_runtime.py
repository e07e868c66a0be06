"""The openvino package, loaded with its usage statistics off: what the OpenVINO backend
(openvino.py) and its int8 build (openvino_build.py) both import first."""

from __future__ import annotations

import sys

from numaserve.checkpoint.errors import ModelLoadError

INSTALL_HINT = (
    "model.backend openvino needs the openvino package, a numaserve dependency that is "
    "missing here: reinstall numaserve, or set model.backend: onnxruntime"
)


def import_openvino():
    """openvino, with its usage statistics switched off before it loads: its converter and
    NNCF send them unless told not to, and no numaserve process reaches off the host."""
    sys.modules.setdefault("openvino_telemetry", None)  # their senders import it; None: absent
    try:
        import openvino
    except ImportError:
        raise ModelLoadError(INSTALL_HINT) from None
    return openvino
