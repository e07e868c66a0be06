"""The machine a benchmark ran on, as every figure must say it: `numaserve topology`'s text
(the CPU's sockets, nodes, cores and ISA), printed and kept with the results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def topology() -> str:
    """`numaserve topology`'s text, printed."""
    text = subprocess.run(
        [str(Path(sys.executable).with_name("numaserve")), "topology"],
        capture_output=True,
        text=True,
    ).stdout
    print(text)
    return text
