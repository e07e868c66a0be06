"""Process lifetime shared by the router and the workers."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys

from numaserve.config.schema import ConfigError
from numaserve.processes.logs import setup_logging

PR_SET_PDEATHSIG = 1
PARENT_ENV = "NUMASERVE_PARENT_PID"  # the supervisor's pid, set in its children's environment


def die_with_parent(parent: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send us `sig` when the process that started us dies.

    (It fires when the parent *thread* exits, so the supervisor spawns from its main thread.)
    A parent that died before the request took effect sends nothing: if `parent` (by default
    the supervisor's pid from our environment) is no longer our parent, we exit at once
    rather than run on as an orphan.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if parent is None and os.environ.get(PARENT_ENV, "").isdigit():
        parent = int(os.environ[PARENT_ENV])
    if parent is not None and os.getppid() != parent:
        sys.exit(1)


def read_spec(spec_type, prog: str, argv: list[str] | None, log: logging.Logger):
    """Parse `--spec JSON` for a child process and set up its logging; None for a bad spec
    (logged), on which the child exits with exitcodes.MODEL."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--spec", required=True, help=f"the {spec_type.__name__} as JSON")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        return spec_type.from_json(args.spec)
    except ConfigError as e:
        log.error("bad %s: %s", spec_type.__name__, e)
        return None
