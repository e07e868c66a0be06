"""What a router shard reports of itself (status/report.py's `ShardReport`): the processes it
routes to, its pools, cache and counters; the whole server's status where it must answer
alone; and the status questions it has asked the supervisor to answer."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from numaserve.host.pinning import affinity_if_alive
from numaserve.router.dispatch import Dispatcher
from numaserve.status.merge import server_report
from numaserve.status.report import (
    Cache,
    Pool,
    Routing,
    ServerReport,
    ShardReport,
    SlotEntry,
    SlotTable,
)
from numaserve.wire import protocol

if TYPE_CHECKING:
    from numaserve.processes.specs import RouterSpec
    from numaserve.router.book import RequestBook
    from numaserve.router.connections import Connections
    from numaserve.router.metrics import RouterMetrics


def shard(
    spec: RouterSpec,
    dispatch: Dispatcher,
    book: RequestBook,
    metrics: RouterMetrics,
    connections: Connections,
) -> ShardReport:
    """One shard's report of itself, as it sends the supervisor."""
    return ShardReport(
        task=spec.model.task,
        model_name=spec.model_name,
        shard=spec.shard,
        cpus=spec.binding.cpus,
        model=spec.model.path,
        routing=routing(dispatch),
        pools=pools(dispatch, spec.model_name),
        cache=Cache(**book.cache.stats()),
        requests={**book.counters, **connections.counts(), **traced_counts(book, dispatch)},
        errors=dict(book.errors),
        metrics=metrics.wire(),
        draining=book.draining_until is not None,
        routed_pids=routed_pids(dispatch),
    )


def answered_alone(own: ShardReport, dispatch: Dispatcher, table: SlotTable | None) -> ServerReport:
    """The whole server's status as this shard alone can give it: with no supervisor, or
    one that did not answer in time. The slots are the supervisor's latest table, or, with
    none, the instances this shard knows."""
    if table is not None:
        return server_report(table.slots, table.supervisor, [own])
    return server_report(known_slots(dispatch, own.shard), None, [own])


def traced_counts(book: RequestBook, dispatch: Dispatcher) -> dict[str, int]:
    """The spans this shard and its instances could not deliver to the collector, where
    they trace."""
    if book.traces is None:
        return {}
    return {
        "spans_dropped": book.traces.tracing.dropped(),
        "instance_spans_dropped": dispatch.spans_dropped(),
    }


def routing(dispatch: Dispatcher) -> tuple[Routing, ...]:
    """What this shard knows of each process it has heard READY from."""
    entries = []
    for w in sorted(dispatch.workers.values(), key=lambda w: w.name):
        entries.append(
            Routing(
                name=w.name,
                pid=w.ready.pid,
                routed=not w.stopping,
                threads=w.ready.threads,
                membind=w.ready.membind,
                model_path=w.ready.model_path,
                weights=w.ready.weights,
                busy=w.jobs,
                served=w.served,
                passes=w.passes,
                labels=list(w.ready.labels) or None,
            )
        )
    return tuple(entries)


def known_slots(dispatch: Dispatcher, shard_number: int) -> tuple[SlotEntry, ...]:
    """With no supervisor, a slot per instance this shard knows, from its READY, with its
    live affinity read here (for a status question, not in the request loop)."""
    return tuple(
        SlotEntry(
            name=w.name,
            pool=dispatch.pools[w.pool].config.name,
            state="draining" if w.stopping else "ready",
            pid=w.ready.pid,
            binding=w.ready.binding,
            shard=shard_number,
            live_cpus=affinity_if_alive(w.ready.pid),
        )
        for w in dispatch.workers.values()
    )


def pools(dispatch: Dispatcher, model_name: str) -> tuple[Pool, ...]:
    return tuple(
        Pool(
            name=p.config.name,
            model_name=model_name,
            max_tokens=p.config.max_tokens,
            queue=p.queued(),
            ready=sum(1 for w in dispatch.workers.values() if w.pool == i and not w.stopping),
        )
        for i, p in enumerate(dispatch.pools)
    )


def routed_pids(dispatch: Dispatcher) -> tuple[int, ...]:
    """The instances the router hears from and sends work to: the supervisor counts an
    instance ready once it appears here."""
    return tuple(sorted(w.ready.pid for w in dispatch.workers.values() if not w.stopping))


class WholeStatusQueries:
    """Status ops this shard has asked the supervisor to answer for the whole server, as it
    answers its control socket (the shards never forward their statuses to each other). One
    the supervisor leaves unanswered is answered by this shard alone."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.waiting: dict[int, tuple[list[bytes], object, float]] = {}
        self.tokens = itertools.count()

    def ask(self, envelope: list[bytes], request_id, now: float) -> dict:
        """The question for the supervisor."""
        token = next(self.tokens)
        self.waiting[token] = (envelope, request_id, now + self.timeout_s)
        return {"type": protocol.WHOLE, "token": token}

    def answered(self, body: dict) -> tuple[list[bytes], object, dict | None] | None:
        """(envelope, request id, the whole server's status) for the supervisor's answer; a
        status of None: it had none to give (no shard has reported yet)."""
        token, whole = body.get("token"), body.get("server")
        asked = self.waiting.pop(token, None) if isinstance(token, int) else None
        if asked is None:
            return None
        return asked[0], asked[1], whole if isinstance(whole, dict) else None

    def expired(self, now: float) -> list[tuple[list[bytes], object]]:
        late = [token for token, (_, _, expires) in self.waiting.items() if expires <= now]
        return [self.waiting.pop(token)[:2] for token in late]
