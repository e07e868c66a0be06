"""The kernel's per-node allocation counters (/sys/devices/system/node/nodeN/numastat).

`numa_miss` and `other_node` grow when memory comes from a node other than the one a process
runs on or asked for: with every instance bound to its own node they should stay flat while
serving. Read on each scrape; a node whose file is missing or unreadable is left out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from numaserve.host.topology import LIVE_SYSFS


def read_numastat(sysfs_root: str | os.PathLike = LIVE_SYSFS) -> dict[int, dict[str, int]]:
    """{node: {counter: pages}} for every node the kernel lists, every counter its file has
    (monitoring/exposition.py exports those it documents)."""
    out: dict[int, dict[str, int]] = {}
    for path in Path(sysfs_root, "devices/system/node").glob("node*/numastat"):
        match = re.fullmatch(r"node(\d+)", path.parent.name)
        if match is None:
            continue
        try:
            text = path.read_text()
        except OSError:
            continue
        counters = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name and value.strip().isdigit():
                counters[name] = int(value)
        out[int(match.group(1))] = counters
    return dict(sorted(out.items()))
