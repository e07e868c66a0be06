"""Whether a process has exited, as the tests must ask it.

A zombie has exited: only its parent has not reaped it yet. An orphan is adopted by PID 1 (or
the nearest subreaper), and some PID 1s, CI's among them, never reap; `os.kill(pid, 0)` and
`psutil.pid_exists` still see such a process.
"""

from __future__ import annotations

import time

import psutil


def still_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still running after `timeout` seconds (an empty list once all have exited)."""
    deadline = time.monotonic() + timeout
    while (running := [p for p in pids if still_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running
