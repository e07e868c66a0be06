"""The ports the kernel hands outgoing connections as their own (ip_local_port_range, less
ip_local_reserved_ports): a server that listens on one of them may find it held by a
connection of this host's (a worker's, a client's) when it starts, and cannot listen."""

from __future__ import annotations

from pathlib import Path

from numaserve.host.cpulist import parse_cpulist

NET = Path("/proc/sys/net/ipv4")
LINUX_DEFAULT = (32768, 60999)


def local_port_range(net: Path = NET) -> tuple[int, int]:
    """The range outgoing connections' ports come from (Linux's default where unreadable)."""
    try:
        low, high = (net / "ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return LINUX_DEFAULT


def may_be_taken(port: int, net: Path = NET) -> bool:
    """Whether an outgoing connection may be given `port`: in the range, not reserved."""
    low, high = local_port_range(net)
    if not low <= port <= high:
        return False
    try:
        reserved = parse_cpulist((net / "ip_local_reserved_ports").read_text().strip())
    except (OSError, ValueError):
        reserved = []
    return port not in reserved
