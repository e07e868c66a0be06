"""Polling until a condition holds, for tests that watch a real server change state."""

from __future__ import annotations

import time


def eventually(check, timeout: float = 30.0, every: float = 0.5):
    """`check()`'s first truthy result; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)
    return result
