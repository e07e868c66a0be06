"""TEI's messages and services, read from its proto (tei.proto beside this file) once, by
grpcio-tools at a front's start (about 0.2 s): no generated code to keep in step with it."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).parent
SERVICES = ("Info", "Embed", "Predict", "Rerank", "Tokenize")  # TEI's, in tei.v1
PACKAGE = "tei.v1"


@cache
def tei() -> tuple[ModuleType, ModuleType]:
    """(messages, services): tei_pb2 and tei_pb2_grpc, as protoc would generate them. The
    proto is read as `tei.proto`, its name in TEI, so that reflection names it the same."""
    import grpc

    sys.path.insert(0, str(HERE))
    try:
        return grpc.protos_and_services("tei.proto")
    finally:
        sys.path.remove(str(HERE))


def full_names() -> tuple[str, ...]:
    """Each service's full name, as health and reflection know it: tei.v1.Embed, ..."""
    return tuple(f"{PACKAGE}.{name}" for name in SERVICES)
