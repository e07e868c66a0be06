"""Addresses in a config: `host:port` (server.metrics, server.http) and ZeroMQ endpoints, and
whether other hosts can reach one."""

from __future__ import annotations

import ipaddress
import re


def split_host_port(address: str) -> tuple[str, int] | None:
    """("::1", 8080) for "[::1]:8080"; None for anything that is not host:port (port 0, any
    free port, included: a config refuses it, a test's endpoint may ask for it)."""
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})", address)
    if not match or int(match.group(2)) > 65535:
        return None
    return match.group(1).strip("[]"), int(match.group(2))


def is_local(endpoint: str) -> bool:
    """ipc, or tcp on a loopback address: nothing beyond this host can connect."""
    if endpoint.startswith("ipc://"):
        return True
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or an interface (tcp://eth0:5555): it may face the network
        return False
