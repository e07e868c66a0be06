"""A front's errors, whatever the transport: an `ApiError` carries the HTTP status and TEI's
`error_type` it has in TEI's HTTP API; each transport says it its own way (http/api_errors.py
in each HTTP API's shape, grpc_api/ as TEI's gRPC status codes)."""

from __future__ import annotations

from numaserve.wire.protocol import ErrorCode


class ApiError(Exception):
    """An answer other than success: its status, TEI's `error_type` (one of TEI's own: a
    status of numaserve's own, 401 or 404, is a Validation error), and why."""

    def __init__(self, status: int, message: str, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


# A shard's error code -> the HTTP status and TEI's error_type.
FROM_CODE = {
    ErrorCode.BAD_REQUEST.value: (422, "Validation"),
    ErrorCode.TOO_LONG.value: (422, "Validation"),
    ErrorCode.OVERLOADED.value: (429, "Overloaded"),
    ErrorCode.DEADLINE_EXCEEDED.value: (504, "Backend"),
    ErrorCode.NO_INSTANCE.value: (503, "Unhealthy"),
    ErrorCode.INTERNAL.value: (424, "Backend"),
}


def from_reply(error: dict) -> ApiError:
    status, kind = FROM_CODE.get(str(error.get("code")), (500, "Backend"))
    return ApiError(status, str(error.get("message", "")), kind)
