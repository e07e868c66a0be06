"""Addresses in a config: `host:port` (server.metrics, server.http) and ZeroMQ endpoints, and
whether other hosts can reach one."""

from __future__ import annotations

import ipaddress
import re
import socket


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
    # A name or an interface (tcp://eth0:5555) is not: it may face the network.
    return _loopback(endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]"))


WILDCARDS = ("*", "0.0.0.0", "::")


def reaches(bound: str, asked: str) -> bool:
    """Whether a client's `asked` endpoint reaches, on this host, a server bound at `bound`
    (how `numaserve status` and `stop` find a local server's control socket): the same ipc
    path; or tcp on the same port, at the bound address, a loopback one for a loopback bind,
    or any address of this host for a wildcard bind. Never a remote host's endpoint."""
    if bound.startswith("ipc://") or asked.startswith("ipc://"):
        return bound == asked
    b, a = _tcp(bound), _tcp(asked)
    if b is None or a is None or b[1] != a[1] or not _of_this_host(a[0]):
        return False
    return b[0] in WILDCARDS or bool(_addresses(b[0]) & _addresses(a[0]))


def _tcp(endpoint: str) -> tuple[str, int] | None:
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _addresses(host: str) -> set[str]:
    try:
        return {found[4][0] for found in socket.getaddrinfo(host, 0, type=socket.SOCK_DGRAM)}
    except (OSError, UnicodeError):
        return set()


def _of_this_host(host: str) -> bool:
    """An address (or a name for one) of this host: a socket can be bound to it here."""
    for address in _addresses(host):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((address, 0))
            return True
        except OSError:
            continue
    return False
