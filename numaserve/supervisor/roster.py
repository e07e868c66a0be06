"""Every child process of the server, once each: the one list that "all the fronts", "all the
workers" and "every child" read, each by the kind its child knows (`Child.kind`).

The running shape (the router shards, the ZeroMQ frontend, the fronts and one worker a
slot) changes only through `join`, `replace` and `retire`, which the arbiter calls as a
rollout or a stop asks. A retired child (replaced, removed by a reload, or a prepare that was
stopped) is out of the shape and still here until it is reaped. What only a phase has (the
prepare it runs, a reload's replacement while it starts) stays the phase's; `every` counts
those in.
"""

from __future__ import annotations

from numaserve.supervisor.children import Child

# The order they are read in: the shards first (a stop drains them after the fronts)
ROUTING_KINDS = ("router", "frontend", "front")


class Roster:
    def __init__(self, children: list[Child]) -> None:
        self.running: list[Child] = list(children)  # the running shape
        self.retired: list[Child] = []  # out of the shape, still to be reaped

    def of(self, kind: str) -> list[Child]:
        """The running children of one kind, in the order they joined."""
        return [c for c in self.running if c.kind == kind]

    @property
    def routers(self) -> list[Child]:
        return self.of("router")

    @property
    def frontend(self) -> Child | None:
        """The ZeroMQ frontend, where several shards share the endpoint."""
        return next(iter(self.of("frontend")), None)

    @property
    def fronts(self) -> list[Child]:
        return self.of("front")

    @property
    def workers(self) -> dict[str, Child]:
        """Each slot's instance, by the slot's name."""
        return {c.name: c for c in self.of("worker")}

    def routing(self) -> list[Child]:
        """The processes between the clients and the workers: the shards, the ZeroMQ
        frontend, the fronts."""
        return [c for kind in ROUTING_KINDS for c in self.of(kind)]

    def every(self, *phase_own: Child | None) -> list[Child]:
        """Every child there is: the running shape, the retired, and the phase's own."""
        return [*self.running, *self.retired, *(c for c in phase_own if c is not None)]

    def join(self, child: Child) -> None:
        self.running.append(child)

    def replace(self, old: Child, new: Child) -> None:
        """`new` takes `old`'s place in the shape (a slot's renewed instance); `old` retires."""
        self.running[self.running.index(old)] = new
        self.retired.append(old)

    def retire(self, child: Child) -> None:
        """Out of the shape (if it was in it), reaped as retired."""
        if child in self.running:
            self.running.remove(child)
        self.retired.append(child)

    def reaped(self, child: Child) -> bool:
        """Whether `child` was retired; it is gone from here now."""
        if child in self.retired:
            self.retired.remove(child)
            return True
        return False
