"""The `numaserve` console script of this environment, run as a user runs it."""

import os
import shutil
import subprocess
import sys


def numaserve(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = shutil.which("numaserve", path=os.path.dirname(sys.executable)) or "numaserve"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout)
