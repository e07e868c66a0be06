"""A plain HTTP GET for the tests of the metrics and health endpoint (and of Prometheus):
an error status is an answer to check, not an exception."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str, str]:
    """(status, Content-Type, body) of GET `url`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()
