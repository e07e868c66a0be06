"""What a router shard reports of itself (status/report.py's `Report`): its instances, pools,
cache and counters; and the status questions it has asked the supervisor to answer for the
whole server."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import TYPE_CHECKING

from numaserve.host.pinning import affinity_if_alive
from numaserve.router.dispatch import Dispatcher
from numaserve.status.report import Cache, Instance, Pool, Report, SlotTable
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
    table: SlotTable | None,
) -> Report:
    """One shard's state, as its status answer carries it; where a supervisor runs, one
    instance entry per slot of its plan (its slot `table`)."""
    return Report(
        task=spec.model.task,
        model_name=spec.model_name,
        shard=spec.shard,
        cpus=list(spec.cpus),
        model=spec.model.path,
        instances=instances(dispatch, table.slots if table else None),
        pools=pools(dispatch, spec.model_name),
        cache=Cache(**book.cache.stats()),
        requests={**book.counters, **connections.counts(), **traced_counts(book, dispatch)},
        errors=dict(book.errors),
        metrics=metrics.wire(),
        draining=book.draining_until is not None,
        routed_pids=routed_pids(dispatch),
        supervisor=table.supervisor if table else None,
    )


def traced_counts(book: RequestBook, dispatch: Dispatcher) -> dict[str, int]:
    """The spans this shard and its instances could not deliver to the collector, where
    they trace."""
    if book.traces is None:
        return {}
    return {
        "spans_dropped": book.traces.tracing.dropped(),
        "instance_spans_dropped": dispatch.spans_dropped(),
    }


def instances(dispatch: Dispatcher, slots: tuple[Instance, ...] | None) -> tuple[Instance, ...]:
    """One entry per slot of the supervisor's plan (`slots`, each with its live affinity as the
    supervisor read it), or, with no supervisor, per instance the router knows; each with what
    the router sees of it and its live affinity."""
    live = {w.info.get("pid"): w for w in dispatch.workers.values()}
    supervised = slots is not None
    if slots is None:
        slots = tuple(
            Instance(
                name=w.name,
                pool=dispatch.pools[w.pool].config.name,
                state="draining" if w.stopping else "ready",
                pid=w.info.get("pid"),
                cpus=w.info.get("cpus"),
                nodes=w.info.get("nodes"),
            )
            for w in dispatch.workers.values()
        )
    entries = []
    for instance in sorted(slots, key=lambda s: s.name):
        worker = live.get(instance.pid)
        # The supervisor reads it (its slot table's live_cpus), off this loop; a router run
        # without one reads it itself, for a status request.
        live_cpus = instance.live_cpus if supervised else affinity_if_alive(instance.pid)
        entries.append(
            replace(
                instance,
                routed=worker is not None and not worker.stopping,
                threads=worker.info.get("threads") if worker else None,
                membind=worker.info.get("membind") if worker else None,
                model_path=worker.info.get("model_path") if worker else None,
                weights=worker.info.get("weights") if worker else None,
                busy=worker.jobs if worker else 0,
                served=worker.served if worker else 0,
                live_cpus=live_cpus,
                affinity_ok=live_cpus == instance.cpus if live_cpus is not None else None,
            )
        )
    return tuple(entries)


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
    return tuple(sorted(w.info.get("pid") for w in dispatch.workers.values() if not w.stopping))


class WholeStatusQueries:
    """Status ops a shard among several has asked the supervisor to answer for the whole
    server (numaserve/status/merge.py): the shards never forward their statuses to each other.
    One the supervisor leaves unanswered is answered with the shard's own status."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.waiting: dict[int, tuple[list[bytes], object, float]] = {}
        self.tokens = itertools.count()

    def ask(self, envelope: list[bytes], request_id, own: Report, now: float) -> dict:
        """The question for the supervisor, with this shard's own status, fresh."""
        token = next(self.tokens)
        self.waiting[token] = (envelope, request_id, now + self.timeout_s)
        return {"type": protocol.WHOLE, "token": token, "server": own.to_wire()}

    def answered(self, body: dict) -> tuple[list[bytes], object, dict] | None:
        """(envelope, request id, the whole server's status) for the supervisor's answer."""
        token, whole = body.get("token"), body.get("server")
        if not isinstance(whole, dict) or not isinstance(token, int):
            return None
        asked = self.waiting.pop(token, None)
        return None if asked is None else (asked[0], asked[1], whole)

    def expired(self, now: float) -> list[tuple[list[bytes], object]]:
        late = [token for token, (_, _, expires) in self.waiting.items() if expires <= now]
        return [self.waiting.pop(token)[:2] for token in late]
