"""API keys for the HTTP front (server.http_api_keys_file): one key per line, `#` comments.

The file is looked at again at most once a second and re-read when it changed, so a key added
or revoked applies within a second, with no restart (as the CurveZMQ keys directory does). Keys
are held as SHA-256 digests and a request's key is looked up by its own: no comparison whose
time depends on how much of a key an attacker guessed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time

from numaserve.http.errors import ApiError

log = logging.getLogger("numaserve.http")
RECHECK_S = 1.0
MIN_KEY_CHARS = 16


class ApiKeys:
    def __init__(self, path: str | None):
        self.path = path
        self.digests: frozenset[bytes] = frozenset()
        self.stamp: tuple | None = None
        self.checked = 0.0
        if path:
            self.reload()

    def reload(self) -> None:
        """Read the file again if it changed; a file that cannot be read keeps the old keys
        (and an unreadable one at start leaves none: every request is refused). Without a
        file, keys are off and there is nothing to read."""
        if not self.path:
            return
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
            if stamp == self.stamp:
                return
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            log.error("server.http_api_keys_file: cannot read %s: %s", self.path, e)
            return
        keys = [line.strip() for line in lines]
        keys = [k for k in keys if k and not k.startswith("#")]
        short = [k for k in keys if len(k) < MIN_KEY_CHARS]
        if short:
            log.warning(
                "%s: %d key(s) shorter than %d characters are ignored (too easy to guess)",
                self.path,
                len(short),
                MIN_KEY_CHARS,
            )
        self.digests = frozenset(_digest(k) for k in keys if len(k) >= MIN_KEY_CHARS)
        self.stamp = stamp
        log.info("API keys: %d from %s", len(self.digests), self.path)

    def check(self, authorization: str | None) -> None:
        """Nothing where keys are off or the request has one of them; else a 401."""
        if not self.path:
            return
        now = time.monotonic()
        if now - self.checked >= RECHECK_S:
            self.checked = now
            self.reload()
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "this server needs an API key: Authorization: Bearer KEY")
        if _digest(key.strip()) not in self.digests:
            raise ApiError(401, "the API key is not one this server accepts")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
