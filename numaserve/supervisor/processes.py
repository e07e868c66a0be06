"""The supervisor's edge to the OS: processes, signals, files and the clock.

Everything the arbiter does to the system goes through a `System`, so that its tests drive
the state machine with a fake one (as supervisord's do with `DummyOptions`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections import deque
from collections.abc import Sequence

import zmq

from numaserve.host.cpuset import CPUSet
from numaserve.host.pinning import affinity_if_alive
from numaserve.processes import procinfo


class System:
    """Signal handlers only enqueue and write a byte to a pipe (gunicorn's arbiter); the loop
    wakes on the pipe and takes the queue."""

    def __init__(self) -> None:
        self.queued: deque[int] = deque()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def pid() -> int:
        return os.getpid()

    @staticmethod
    def identity() -> dict:
        """Who this process is on this host (processes/procinfo.py), for `numaserve stop`."""
        return procinfo.identity()

    def catch(self, signals: tuple[int, ...]) -> None:
        for sig in signals:
            signal.signal(sig, self._enqueue)

    def _enqueue(self, signum, frame) -> None:
        self.queued.append(signum)
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_w, b"s")

    def wait(self, timeout: float, sockets: Sequence[zmq.Socket | int] = ()) -> list[int]:
        """The signals caught, after waiting up to `timeout` for one, or for a message on one
        of `sockets` (a router shard's: one asking for the whole server's status is answered
        at once, not at the next tick; or a file descriptor: the control socket's)."""
        poller = zmq.Poller()
        poller.register(self.wake_r, zmq.POLLIN)
        for sock in sockets:
            poller.register(sock, zmq.POLLIN)
        poller.poll(int(timeout * 1000))
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 4096):
                pass
        caught = []
        while self.queued:
            caught.append(self.queued.popleft())
        return caught

    @staticmethod
    def spawn(argv: list[str], env: dict[str, str], new_session: bool) -> int:
        """Raises OSError when it cannot be started."""
        return os.posix_spawn(argv[0], argv, env, setsid=new_session)

    @staticmethod
    def kill(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    @staticmethod
    def reap() -> list[tuple[int, int]]:
        """(pid, exit code) of each child that has exited: waitpid(-1, WNOHANG) until nothing
        is left. A code is negative for a signal, as os.waitstatus_to_exitcode gives it."""
        exited: list[tuple[int, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # ECHILD: no children at all
                return exited
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                return exited
            exited.append((pid, os.waitstatus_to_exitcode(status)))

    @staticmethod
    def affinity(pid: int) -> CPUSet | None:
        """The CPUs the kernel lets `pid` run on now; None for one that is gone."""
        return affinity_if_alive(pid)

    @staticmethod
    def write_file(path: str, text: str) -> None:
        """Whole or not at all: a reader (the frontend, on SIGHUP) never sees half of it."""
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    @staticmethod
    def read_file(path: str) -> str | None:
        """A file a child writes whole (a front's stats); None where there is none yet."""
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    def close(self) -> None:
        os.close(self.wake_r)
        os.close(self.wake_w)
