"""Which server each request goes to.

A client is given one or more endpoints. A host name that resolves to several addresses (a
Kubernetes headless Service, a round-robin DNS name) stands for all of them, and is looked up
again every `resolve_every` seconds, and soon after any of its addresses stops answering, so
that pods replaced under new addresses are found. Each request goes to the address with the
fewest requests outstanding from this client, in turn among equals: load spreads over every
server, and a slower one gets less. An address that stops answering is set aside until it
answers again (Probes ask it) and at least ASIDE_S has passed, doubling while it keeps
failing each time it is taken back. Pure: the clock and the resolver are given, so tests can
drive both.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

RESOLVE_EVERY_S = 10.0  # CoreDNS answers for a headless Service with a 5 s TTL by default
RESOLVE_SOON_S = 1.0  # after an address is set aside: look up again at most this soon
ASIDE_S = 1.0  # the least time an address that stopped answering stays aside
ASIDE_MAX_S = 16.0

_TCP = re.compile(r"tcp://(\[[^\]]+\]|[^:/;\[\]]+):(\d+)")


def tcp_host(endpoint: str) -> tuple[str, int] | None:
    """The host name and port of a `tcp://name:port` endpoint; None for an IP address, and for
    endpoints that are not looked up (ipc://, inproc://, a source address `tcp://a;b:port`)."""
    match = _TCP.fullmatch(endpoint)
    if match is None:
        return None
    host = match.group(1).strip("[]")
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        return host, int(match.group(2))


def resolve(endpoint: str) -> list[str]:
    """Every address `endpoint`'s host name resolves to, as endpoints; raises OSError where
    the name does not resolve."""
    named = tcp_host(endpoint)
    if named is None:
        return [endpoint]
    host, port = named
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found = {info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)}
    return [f"tcp://[{a}]:{port}" if ":" in a else f"tcp://{a}:{port}" for a in sorted(found)]


@dataclass
class Address:
    """One server address and what this client knows of it."""

    endpoint: str
    outstanding: int = 0  # requests sent and not yet answered or given up
    aside: bool = False
    aside_until: float = 0.0  # not taken back before this, even when it answers
    aside_for: float = ASIDE_S  # how long the next setting aside lasts at least
    answered: bool = False  # a probe's ping came back since it was set aside


class Endpoints:
    """The addresses a client sends to, and how each is doing."""

    def __init__(
        self,
        given: Iterable[str],
        resolve_every: float = RESOLVE_EVERY_S,
        resolver: Callable[[str], list[str]] = resolve,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.given = list(given)
        self.resolve_every, self.resolver, self.clock = resolve_every, resolver, clock
        self.addresses: dict[str, Address] = {}
        self._expanded: dict[str, list[str]] = {}  # each given endpoint's addresses
        self._resolved_at = -float("inf")
        self._turn = 0
        self.named = any(tcp_host(e) for e in self.given)
        self.update({e: [e] for e in self.given if not tcp_host(e)})
        if self.named:
            self.update(self.lookup())

    def resolve_due(self) -> bool:
        """Whether a host name among the endpoints is due to be looked up again."""
        if not self.named:
            return False
        since = self.clock() - self._resolved_at
        soon = any(a.aside for a in self.addresses.values())
        return since >= self.resolve_every or (soon and since >= RESOLVE_SOON_S)

    def lookup(self) -> dict[str, list[str]]:
        """Each named endpoint's addresses now; one that does not resolve keeps those it had
        (or, the first time, stays the name itself, for libzmq to try and the link watch to
        report). Blocking: an asyncio client runs it in an executor."""
        found = {}
        for endpoint in self.given:
            if tcp_host(endpoint):
                try:
                    found[endpoint] = self.resolver(endpoint) or [endpoint]
                except OSError:
                    found[endpoint] = self._expanded.get(endpoint, [endpoint])
        return found

    def update(self, found: dict[str, list[str]]) -> list[str]:
        """Take in a lookup's result; returns the addresses no longer among the endpoints."""
        if any(tcp_host(e) for e in found):
            self._resolved_at = self.clock()
        self._expanded |= found
        wanted = list(dict.fromkeys(a for e in self.given for a in self._expanded.get(e, ())))
        gone = [a for a in self.addresses if a not in wanted]
        self.addresses = {a: self.addresses.get(a) or Address(a) for a in wanted}
        return gone

    def choose(self, tried: Iterable[str] = ()) -> str:
        """The address for the next try: among those answering and not yet tried by this
        call, the one with the fewest outstanding requests (in turn among equals); where none
        is left, one set aside (it may be back), then one already tried."""
        if len(self.addresses) == 1:  # the common case, at no cost
            return next(iter(self.addresses))
        tried = set(tried)
        everyone = list(self.addresses.values())
        pools = (
            [a for a in everyone if not a.aside and a.endpoint not in tried],
            [a for a in everyone if a.endpoint not in tried],
            everyone,
        )
        pool = next(p for p in pools if p)
        n = len(everyone)
        place = {a.endpoint: i for i, a in enumerate(everyone)}
        best = min(pool, key=lambda a: (a.outstanding, (place[a.endpoint] - self._turn) % n))
        self._turn = place[best.endpoint] + 1
        return best.endpoint

    def sent(self, endpoint: str) -> None:
        if (address := self.addresses.get(endpoint)) is not None:
            address.outstanding += 1

    def done(self, endpoint: str) -> None:
        if (address := self.addresses.get(endpoint)) is not None:
            address.outstanding = max(0, address.outstanding - 1)

    def succeeded(self, endpoint: str) -> None:
        """A reply came: the address is answering (a later setting aside starts short)."""
        if (address := self.addresses.get(endpoint)) is not None:
            address.aside, address.aside_for = False, ASIDE_S

    def set_aside(self, endpoint: str) -> bool:
        """The address stopped answering; False where it was aside already."""
        address = self.addresses.get(endpoint)
        if address is None or address.aside:
            return False
        address.aside, address.answered = True, False
        address.aside_until = self.clock() + address.aside_for
        address.aside_for = min(address.aside_for * 2, ASIDE_MAX_S)
        return True

    def answered(self, endpoint: str) -> None:
        """A probe's ping to a set-aside address came back."""
        if (address := self.addresses.get(endpoint)) is not None:
            address.answered = True

    def take_back(self) -> list[str]:
        """Take back the set-aside addresses that answered and whose time aside is over."""
        now = self.clock()
        back = [
            a for a in self.addresses.values() if a.aside and a.answered and now >= a.aside_until
        ]
        for address in back:
            address.aside = False
        return [a.endpoint for a in back]

    def aside(self) -> list[str]:
        return [a.endpoint for a in self.addresses.values() if a.aside]
