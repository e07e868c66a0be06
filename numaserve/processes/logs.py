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
        for key in ("event", "instance", "request_id", "trace_id", "trace_ids"):
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


class Summary:
    """Counts a repeated event (`total` is what status reports) and logs it at most once per
    `every` seconds, with the count: clients that open a connection per request (the CLI, a
    Lazy Pirate retry), or a client sending the same bad message in a loop, must not fill the
    log."""

    def __init__(self, log: logging.Logger, what: str, every: float, level: int = logging.INFO):
        self.log, self.what, self.every, self.level = log, what, every, level
        self.unlogged = self.total = 0
        self.next_log = 0.0
        self.detail = ""  # of the latest occurrence (a traceback)

    def add(self, count: int, now: float, detail: str = "") -> None:
        self.unlogged += count
        self.total += count
        self.detail = detail or self.detail
        self.flush(now)

    def flush(self, now: float) -> None:
        if self.unlogged and now >= self.next_log:
            latest = f"; the latest:\n{self.detail.rstrip()}" if self.detail else ""
            self.log.log(
                self.level, "%d %s (%d in all)%s", self.unlogged, self.what, self.total, latest
            )
            self.unlogged, self.detail = 0, ""
            self.next_log = now + self.every
