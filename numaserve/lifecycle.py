"""Process lifetime shared by the router and the workers."""

from __future__ import annotations

import argparse
import ctypes
import logging
import signal

from numaserve.config import ConfigError
from numaserve.logs import setup_logging

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to send us SIGTERM when the process that started us dies.

    (It fires when the parent *thread* exits, so the supervisor spawns from its main thread.)
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


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
