"""The supervisor's line to each router shard, over the shard's private worker socket.

The supervisor sends its slot table (`numaserve status` shows it); a shard answers each with
its `routed_pids`, the workers it hears from: that is how the supervisor knows an instance is
READY, or has gone silent. Once a second the table asks for the shard's whole report too, for
/metrics, the probes and the whole server's status: it is not built and sent four times a
second. A shard asked for the whole server's status passes the question on (`ShardQuestion`),
and the arbiter answers it as it answers its control socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import zmq

from numaserve.processes.specs import RouterSpec
from numaserve.status.report import BadReport, ShardReport, SlotTable
from numaserve.supervisor.children import Child, State
from numaserve.supervisor.roster import Roster
from numaserve.wire import protocol

REPORT_S = 1.0  # how often a shard sends its whole report, besides what liveness needs


def _pids(value) -> set[int]:
    if not isinstance(value, list) or not all(isinstance(pid, int) for pid in value):
        raise BadReport(f"routed_pids: expected a list of pids, got {value!r:.80}")
    return set(value)


class RouterLink:
    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)

    def send(self, message: dict) -> None:
        """Never blocks: with the router down, the message is dropped (a newer one follows)."""
        with contextlib.suppress(zmq.Again):
            self.sock.send_multipart(protocol.pack(message), zmq.NOBLOCK)

    def receive(self) -> list[dict]:
        """The router's answers waiting now; unparseable ones are skipped."""
        answers = []
        while self.sock.poll(0):
            with contextlib.suppress(protocol.ProtocolError):
                answers.append(protocol.unpack(self.sock.recv_multipart()))
        return answers

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@dataclass(eq=False)
class ShardView:
    """What the supervisor knows of one router shard."""

    child: Child
    link: RouterLink
    routed: set[int] | None = None  # the workers it hears from, by its latest answer
    status: ShardReport | None = None  # its latest report
    heard_at: float = 0.0  # when it last answered
    acked: int = 0  # the latest slot table it has answered
    seq_floor: int = 0  # answers to tables sent before its (re)start are stale

    def routed_pids(self, now: float, fresh_s: float) -> set[int] | None:
        """The workers it hears from; None with no fresh word from it (judge nobody)."""
        if self.routed is None or now - self.heard_at > fresh_s:
            return None
        return self.routed


@dataclass(frozen=True)
class ShardQuestion:
    """A status op a client asked a shard, which the shard passed on: answered as the
    control socket's (`answer` takes the same body), back to the shard, with its token."""

    view: ShardView
    token: int

    def answer(self, body: dict) -> None:
        """`body`: {"status": the whole server's} or {"error": ...} (the shard then answers
        alone)."""
        self.view.link.send(
            {"type": protocol.WHOLE, "token": self.token, "server": body.get("status")}
        )


class ShardLinks:
    """A view of each router shard the roster runs, and the slot tables the supervisor sends
    them: numbered, so that an answer says which table a shard has seen (`acked`), and a
    shard's answers to the tables sent before its (re)start are known to be stale
    (`seq_floor`). The shards are the roster's: a shard that joins it gets its link here, and
    one that leaves it has its link closed; nothing else adds or removes one."""

    def __init__(
        self,
        roster: Roster,
        connect: Callable[[str], RouterLink],
        poll_s: float,
        report_s: float = REPORT_S,
    ) -> None:
        self.roster, self.connect = roster, connect
        self._by_child: dict[int, ShardView] = {}  # by id() of the shard's Child
        self.poll_s, self.report_s = poll_s, report_s
        self.sent = 0  # the sequence number of the latest slot table sent
        self.next_send = 0.0
        self.next_report = 0.0  # when a table next asks for the shards' whole reports

    @property
    def views(self) -> list[ShardView]:
        """One per router shard in the roster's running shape, in its order."""
        return self.sync()

    def sync(self) -> list[ShardView]:
        """The views, as the roster runs its shards now: a link made for each shard that
        joined, closed for each that left."""
        routers = self.roster.routers
        running = {id(child): child for child in routers}
        for key, view in list(self._by_child.items()):
            if running.get(key) is not view.child:  # it left the shape
                del self._by_child[key]
                view.link.close()
        for key, child in running.items():
            if key not in self._by_child:  # it joined
                endpoint = child.spec_as(RouterSpec).workers_endpoint
                self._by_child[key] = ShardView(child, self.connect(endpoint))
        return [self._by_child[id(child)] for child in routers]

    def __iter__(self):
        return iter(self.views)

    def __len__(self) -> int:
        return len(self.views)

    def __getitem__(self, i: int) -> ShardView:
        return self.views[i]

    def of(self, child: Child) -> ShardView | None:
        return next((v for v in self.views if v.child is child), None)

    def restarted(self, view: ShardView) -> None:
        """It is ready when *it* answers, not its predecessor."""
        view.routed = view.status = None
        view.seq_floor = self.sent
        self.next_report = 0.0  # its first report with the next table

    def want_reports(self) -> None:
        """The next table asks every shard for its whole report."""
        self.next_report = 0.0

    def receive(self, now: float) -> list[ShardQuestion]:
        """Each shard's answers waiting now: its latest status, and the table it answers; and
        the status questions shards pass on, for the arbiter to answer."""
        questions = []
        for view in self.views:
            for body in view.link.receive():
                seq = body.get("seq") or 0
                if body.get("type") == protocol.STATUS and seq > view.seq_floor:
                    try:
                        routed = _pids(body.get("routed_pids"))
                        if "server" in body:
                            view.status = ShardReport.from_wire(body["server"])
                    except BadReport:
                        continue  # not heard: a shard of another version, or a bug
                    view.routed, view.heard_at = routed, now
                    view.acked = max(view.acked, seq)
                elif body.get("type") == protocol.WHOLE and type(body.get("token")) is int:
                    questions.append(ShardQuestion(view, body["token"]))
        return questions

    def send(self, table: SlotTable, now: float) -> None:
        """`table` to every shard, numbered: the same message to each."""
        self.next_send = now + self.poll_s
        self.sent += 1
        report = now >= self.next_report
        if report:
            self.next_report = now + self.report_s
        told = replace(table.supervisor, seq=self.sent)
        body = replace(table, supervisor=told, report=report).to_wire()
        for view in self.views:
            view.link.send(body)

    def routed_pids(self, now: float) -> dict[int, set[int] | None]:
        """Per shard, the workers it hears from (None: no fresh word, judge nobody)."""
        return {v.child.shard: v.routed_pids(now, 4 * self.poll_s) for v in self.views}

    def all_acked(self, seq: int, views: list[ShardView] | None = None) -> bool:
        return all(v.acked >= seq for v in (self.views if views is None else views))

    def serving_acked(self, seq: int) -> bool:
        """Every shard that serves (READY) has answered table `seq`: what it reports shows it."""
        return self.all_acked(seq, [v for v in self.views if v.child.state == State.READY])

    def close(self) -> None:
        for view in self._by_child.values():
            view.link.close()
        self._by_child.clear()
