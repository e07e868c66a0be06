"""Worker exit codes: a contract with the supervisor, documented in docs/worker.md.

The supervisor restarts a worker that exits with anything else (after a backoff), but never one
that exits with MODEL or PINNING: those cannot succeed on a retry, so restarting would only loop.
"""

import signal

OK = 0  # asked to stop (SIGTERM, parent gone) and stopped cleanly
CRASH = 1  # an unexpected error: worth a restart
PINNING = 71  # the slot's CPUs or memory node could not be bound (EX_OSERR)
MODEL = 78  # bad model config, or the model cannot be loaded (EX_CONFIG)

NEVER_RESTART = frozenset({PINNING, MODEL})

DESCRIPTION = {
    OK: "stopped cleanly",
    CRASH: "crashed",
    PINNING: "could not be pinned to its slot",
    MODEL: "could not load its model",
}


def signal_name(number: int) -> str:
    """SIGKILL, SIGRTMIN+3, or "signal 99": any number a process can be killed by, never an
    error (signal.Signals() raises for the real-time signals, which have no names)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
            return f"SIGRTMIN+{number - signal.SIGRTMIN}"
        return f"signal {number}"
