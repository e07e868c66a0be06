"""The `numaserve` console script of this environment, run as a user runs it."""

import os
import shutil
import subprocess
import sys


def numaserve_exe() -> str:
    """This environment's `numaserve` script (else the one on PATH)."""
    return shutil.which("numaserve", path=os.path.dirname(sys.executable)) or "numaserve"


def numaserve(
    *args, timeout: float = 60, stdin: str | None = None, env: dict | None = None, cwd=None
) -> subprocess.CompletedProcess:
    """`stdin`: what standard input holds (default: nothing); `env`: added to the environment;
    `cwd`: the directory it runs in (default: this one)."""
    return subprocess.run(
        [numaserve_exe(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin or "",
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
