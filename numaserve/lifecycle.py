"""Process lifetime shared by the router and the workers."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to send us SIGTERM when the process that started us dies.

    (It fires when the parent *thread* exits, so the supervisor spawns from its main thread.)
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
