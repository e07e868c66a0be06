"""A rolling restart (SIGHUP): each READY slot is replaced by one started from the new config,
one slot at a time, and the old instance stops only once its replacement is READY, so that
capacity never drops by more than one instance."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from numaserve.config import Config
from numaserve.specs import Deployment, WorkerSpec
from numaserve.supervisor.children import Child


@dataclass
class Reload:
    config: Config
    deployment: Deployment
    waiting: deque[str]  # slots still to restart, in plan order
    replacement: Child | None = None  # the new instance of the slot being restarted

    def spec(self, name: str) -> WorkerSpec:
        return next(w for w in self.deployment.workers if w.name == name)


def unapplied_changes(current: Deployment, new: Deployment) -> list[str]:
    """What a reload cannot change while serving; it applies at the next restart."""
    changes = []
    if [r.to_json() for r in new.routers] != [r.to_json() for r in current.routers] or (
        new.frontend != current.frontend
    ):
        changes.append("router and server settings changed")
    if {w.name for w in new.workers} != {w.name for w in current.workers}:
        changes.append("the placement changed")
    return changes
