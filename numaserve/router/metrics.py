"""What a router shard counts for Prometheus: plain numbers, kept on the request path.

The router never talks to Prometheus. It keeps counters and fixed-bucket histograms here,
sends them with its status (`metrics`), and the supervisor's endpoint renders every shard's
(numaserve/monitoring/). A count is an integer add, an observation one bisect: a few hundred
nanoseconds against the ~90 us a request costs the router.
"""

from __future__ import annotations

from bisect import bisect_left

from numaserve.tasks import TASKS

# Upper bounds, in seconds: a cache hit answers in tens of microseconds, a long text's pass
# on one core takes tens of milliseconds, a queue at its limit seconds.
LATENCY_BOUNDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
PASS_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OPS = (*TASKS, "ping", "status")
PRIORITY = {False: "interactive", True: "bulk"}


class Histogram:
    """Counts by upper bound (Prometheus' `le`), the last for values above every bound."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def wire(self) -> dict:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}


class RouterMetrics:
    def __init__(self, pools: list[str]) -> None:
        self.pools = pools
        self.replies: dict[tuple[str, str, str], int] = {}  # (op, "ok" or code, priority)
        self.latency = {
            (op, priority): Histogram(LATENCY_BOUNDS)
            for op in OPS
            for priority in ("interactive", "bulk")
        }
        self.queue_wait = [Histogram(LATENCY_BOUNDS) for _ in pools]
        self.batch = [Histogram(BATCH_BOUNDS) for _ in pools]
        self.texts = [0] * len(pools)
        self.tokens = [0] * len(pools)
        self.passes: dict[str, Histogram] = {}  # by instance name: it outlives a restart

    def replied(
        self, op: object, code: str, seconds: float | None = None, bulk: bool = False
    ) -> None:
        """A reply sent: `op` as the client gave it (anything not an op counts as unknown),
        its request's priority, and, for requests that reached the queue or the cache, how
        long it took."""
        op = op if op in OPS else "unknown"
        key = (op, code, PRIORITY[bulk])
        self.replies[key] = self.replies.get(key, 0) + 1
        if seconds is not None:
            self.latency[op, PRIORITY[bulk]].observe(seconds)

    def dispatched(self, pool: int, waited: list[float], tokens: int) -> None:
        """One job sent: its texts of `pool`, how long each waited in the queue."""
        queue_wait = self.queue_wait[pool]
        for seconds in waited:
            queue_wait.observe(seconds)
        self.batch[pool].observe(len(waited))
        self.texts[pool] += len(waited)
        self.tokens[pool] += tokens

    def forward_pass(self, instance: str, seconds: object) -> None:
        """A worker's own measure of its forward pass (absent from older workers)."""
        if isinstance(seconds, float) and 0.0 <= seconds < 3600.0:
            hist = self.passes.get(instance)
            if hist is None:
                hist = self.passes[instance] = Histogram(PASS_BOUNDS)
            hist.observe(seconds)

    def wire(self) -> dict:
        return {
            "replies": [[*key, n] for key, n in sorted(self.replies.items())],
            "latency": [[*key, h.wire()] for key, h in self.latency.items() if sum(h.counts)],
            "pools": {
                name: {
                    "queue_wait": self.queue_wait[i].wire(),
                    "batch": self.batch[i].wire(),
                    "texts": self.texts[i],
                    "tokens": self.tokens[i],
                }
                for i, name in enumerate(self.pools)
            },
            "passes": {name: h.wire() for name, h in sorted(self.passes.items())},
        }
