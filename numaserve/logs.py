"""Logging for every numaserve process: one line per event on stderr, as text or JSON.

The supervisor passes its choice to the router and workers in the environment, so that the
whole server writes one format (systemd's journal collects all of it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

LEVEL_ENV, FORMAT_ENV = "NUMASERVE_LOG_LEVEL", "NUMASERVE_LOG_FORMAT"


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key in ("event", "instance"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str | None = None, fmt: str | None = None) -> None:
    level = (level or os.environ.get(LEVEL_ENV) or "info").upper()
    fmt = fmt or os.environ.get(FORMAT_ENV) or "text"
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
