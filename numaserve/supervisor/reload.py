"""A reload (SIGHUP): the new config applied while the server serves.

Each READY slot whose instance changed is replaced by one started from the new config, one
slot at a time, and the old instance stops only once its replacement is READY, so that
capacity never drops by more than one instance. With `models:`, a reload may also remove
models (their router shards drain, then their instances stop) and add models (placed on the
cores left free, with router shards of their own), while the models it keeps serve on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from numaserve.config import Config
from numaserve.host.placement import PlacementError, Plan
from numaserve.specs import Deployment, WorkerSpec
from numaserve.supervisor.children import Child


@dataclass
class Reload:
    config: Config
    plan: Plan
    deployment: Deployment
    waiting: deque[str]  # slots still to restart, in plan order
    by_model: bool = False  # two `models:` configs: models may be removed and added
    removed: tuple[str, ...] = ()  # models leaving the server
    added: tuple[str, ...] = ()  # models new to it
    draining: list[Child] = field(default_factory=list)  # the removed models' shards
    stopping: list[Child] = field(default_factory=list)  # and their instances, after them
    reshaped: bool = False  # removed models stopped, added ones started
    replacement: Child | None = None  # the new instance of the slot being restarted
    final_table: int | None = None  # the slot table sent once every slot has its new instance

    def spec(self, name: str) -> WorkerSpec:
        return next(w for w in self.deployment.workers if w.name == name)


def model_changes(current: Config, new: Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(removed, added) model names, for two `models:` configs. Raises PlacementError where a
    kept model's pools would move its running instances: that needs a restart."""
    before = {m.name: m for m in current.models}
    after = {m.name: m for m in new.models}

    def shape(name: str, models: dict) -> list:
        return [
            (p.name, p.cores_per_instance, p.instances, p.core_types) for p in models[name].pools
        ]

    for name in before.keys() & after.keys():
        if shape(name, before) != shape(name, after):
            raise PlacementError(
                f"model {name!r}: its pools' names, instances, cores_per_instance or core_types "
                "changed, which would move its running instances. Restart the server for that, "
                "or remove the model in one reload and add it back in the next"
            )
    removed = tuple(name for name in before if name not in after)
    added = tuple(name for name in after if name not in before)
    return removed, added


def unapplied_changes(current: Deployment, new: Deployment, by_model: bool = False) -> list[str]:
    """What a reload cannot change while serving; it applies at the next restart.
    `by_model`: two `models:` configs, where models may come and go: only the kept models'
    shards are compared, the frontend's routes change live, and the kept models' instances
    stay where they are (host/placement.replan)."""
    changes = []
    kept = {r.model_name for r in current.routers} & {r.model_name for r in new.routers}

    def routers(d: Deployment) -> list[str]:
        return [r.to_json() for r in d.routers if not by_model or r.model_name in kept]

    def frontend(d: Deployment) -> object:
        if d.frontend is None or not by_model:
            return d.frontend
        return (d.frontend.endpoint, d.frontend.max_message_bytes, d.frontend.curve)

    if routers(new) != routers(current) or frontend(new) != frontend(current):
        changes.append("router and server settings changed")
    names = {w.name for w in new.workers}
    if not by_model and names != {w.name for w in current.workers}:
        changes.append("the placement changed")
    return changes
