"""Handing a request to another shard when this one has no instance left for it.

The frontend spreads requests over the shards blindly, and each shard routes only to its own
instances. When a shard's last instance of a pool dies (until the supervisor has restarted it)
or it has none yet, a text for that pool would be refused while another shard could serve it.
Instead the shard passes the whole request (requests are idempotent) to a peer that, by the
supervisor's latest slot table, has ready instances of every pool it needs, as a client
of the peer's client socket, and relays the answer. A handed-over request is never handed over
again: the peer answers it itself, with an error if it must.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import zmq

from numaserve.status.report import SlotTable
from numaserve.tasks.requests import Request
from numaserve.wire import protocol

PREFIX = b"handover/"  # the routing id of a shard's connection to a peer: b"handover/<shard>"


def is_handed_over(envelope: list[bytes]) -> bool:
    """Whether a client message came from a peer shard (clients' ids are libzmq's, 0x00...)."""
    return len(envelope) == 1 and envelope[0].startswith(PREFIX)


@dataclass
class Passed:
    envelope: list[bytes]  # the original client's
    request_id: int | str
    op: str
    peer: int
    expires: float


class Handover:
    def __init__(self, ctx: zmq.Context, shard: int, endpoints: tuple[str, ...], timeout: float):
        """`endpoints`: every shard's handover address, by shard index (this one's included;
        empty for the shards of other models, which serve none of our texts)."""
        self.peers: dict[int, zmq.Socket] = {}
        for peer, endpoint in enumerate(endpoints):
            if peer != shard and endpoint:
                sock = ctx.socket(zmq.DEALER)
                sock.linger = 0
                sock.setsockopt(zmq.ROUTING_ID, PREFIX + str(shard).encode())
                sock.connect(endpoint)
                self.peers[peer] = sock
        self.timeout = timeout
        self.passed: dict[int, Passed] = {}
        self.tokens = itertools.count()

    def peer_for(self, pools: set[str], table: SlotTable | None) -> int | None:
        """A peer of our model, by the supervisor's slot `table`, that is itself ready (not
        starting, nor draining) and has a ready instance of each pool; the one with the most
        ready instances of them."""
        best, most = None, 0
        for peer, counts in sorted(self._ready(table).items()):
            have = min((counts.get(name, 0) for name in pools), default=0)
            if have > most:
                best, most = peer, have
        return best

    def ready_at_peers(self, table: SlotTable | None) -> int:
        """The ready instances of the peers that are themselves ready, by `table`."""
        return sum(sum(counts.values()) for counts in self._ready(table).values())

    def _ready(self, table: SlotTable | None) -> dict[int, dict[str, int]]:
        """Each serving peer's ready instances, by pool."""
        if table is None:
            return {}  # no word from the supervisor yet: no peer is known to be ready
        serving = {shard for shard, state in table.routers if state == "ready"}
        ready: dict[int, dict[str, int]] = {peer: {} for peer in self.peers if peer in serving}
        for slot in table.slots:
            if slot.shard is None or slot.pool is None:
                continue  # a slot no shard routes to
            counts = ready.get(slot.shard)  # None: ours, another model's, not serving
            if counts is not None and slot.state == "ready":
                counts[slot.pool] = counts.get(slot.pool, 0) + 1
        return ready

    def take(
        self,
        pools: set[str],
        table: SlotTable | None,
        envelope: list[bytes],
        request: Request,
        deadline: float | None,
    ) -> bool:
        """Pass `request`, whose texts need `pools`, to the best peer by the supervisor's slot
        `table`; False where none can take it."""
        peer = self.peer_for(pools, table)
        if peer is None:
            return False
        now = time.monotonic()
        left_ms = (deadline - now) * 1000 if deadline is not None else None
        return self.pass_on(peer, envelope, request, left_ms, now)

    def pass_on(
        self, peer: int, envelope: list[bytes], request: Request, left_ms: float | None, now: float
    ) -> bool:
        """Send `request` to `peer`, with what is left of its deadline; False if it cannot."""
        sock = self.peers.get(peer)
        if sock is None:
            return False
        token = next(self.tokens)
        body = request.to_body() | {"id": token}
        body.pop("deadline_ms", None)
        if left_ms is not None:
            body["deadline_ms"] = max(1.0, left_ms)
        try:
            sock.send_multipart(protocol.pack(body), zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        self.passed[token] = Passed(envelope, request.id, request.op, peer, now + self.timeout)
        return True

    def replies(self):
        """(original envelope, reply body with the client's id) for each answer waiting."""
        for sock in self.peers.values():
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    body = protocol.unpack(frames)
                except protocol.ProtocolError:
                    continue
                passed = self.passed.pop(body.get("id"), None)
                if passed is not None:
                    yield passed.envelope, body | {"id": passed.request_id}

    def expired(self, now: float) -> list[Passed]:
        """Requests a peer has not answered in time (it died holding them): forgotten here."""
        late = [t for t, p in self.passed.items() if p.expires <= now]
        return [self.passed.pop(t) for t in late]

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close(linger=0)
