"""API keys for the HTTP front (server.http_api_keys_file): one key per line, `#` comments.

The file is looked at again at most once a second and re-read when it changed, so a key added
or revoked applies within a second, with no restart (as the CurveZMQ keys directory does). Keys
are held as SHA-256 digests and a request's key is looked up by its own: no comparison whose
time depends on how much of a key an attacker guessed. A request bearing a key too short to
be listed (config/keys_file.py) is told so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time

from numaserve.config.keys_file import MIN_KEY_CHARS, KeysFileError, read_keys
from numaserve.front.errors import ApiError

log = logging.getLogger("numaserve.front")
RECHECK_S = 1.0


class ApiKeys:
    def __init__(self, path: str | None):
        self.path = path
        self.digests: frozenset[bytes] = frozenset()
        self.bulk: frozenset[bytes] = frozenset()  # keys whose requests are bulk by default
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
        except OSError as e:
            log.error("server.http_api_keys_file: cannot read %s: %s", self.path, e.strerror)
            return
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if stamp == self.stamp:
            return
        try:
            read = read_keys(self.path)
        except KeysFileError as e:  # keep the keys it had
            log.error("%s", e)
            return
        if problem := read.short_keys_problem(self.path):  # refused at start; edited since
            log.error("%s; the file's other keys apply", problem)
        self.digests = frozenset(_digest(k) for k in read.keys)
        self.bulk = frozenset(_digest(k) for k in read.bulk)
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
        if len(key.strip()) < MIN_KEY_CHARS:
            raise ApiError(
                401,
                f"the API key is shorter than {MIN_KEY_CHARS} characters: none that short "
                "is ever accepted (docs/http.md#api-keys)",
            )
        if _digest(key.strip()) not in self.digests:
            raise ApiError(401, "the API key is not one this server accepts")

    def is_bulk(self, authorization: str | None) -> bool:
        """Whether the request's key (checked already) is marked `bulk` in the file."""
        if not self.bulk:
            return False
        return _digest((authorization or "").partition(" ")[2].strip()) in self.bulk


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
