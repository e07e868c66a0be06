"""The host-wide core ledger: which CPUs each running numaserve server holds, so that a second
server on the same host (another config, another systemd unit) plans around them instead of
pinning onto the same cores.

One JSON file per server, `server-<pid>.json`, held with an exclusive flock for the life of the
server. The kernel drops a lock when its holder dies, however it dies (SIGKILL included), so an
entry whose lock can be taken belongs to a dead server, and is removed by whoever reads it next:
no pid is ever trusted. Beside it, `server-<pid>.sock`: the supervisor's control socket, which
the entry names with the server's endpoint, so that `numaserve status` and `stop` given an
endpoint find the server on this host that serves it. `.lock` makes read, plan and register
one step for servers starting at the same moment.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from numaserve.config.addresses import reaches
from numaserve.config.schema import PlacementConfig, ServedModel
from numaserve.host.cpuset import CPUSet
from numaserve.host.placement import PlacementError, Plan, plan_placement
from numaserve.host.topology import CPUTopology

LEDGER_ENV = "NUMASERVE_LEDGER"  # a directory to use instead of the defaults below
SYSTEM_DIR = Path("/run/numaserve")  # systemd's RuntimeDirectory=numaserve


class CoresHeldError(PlacementError):
    """This server does not fit in what other servers on the host leave free. Trying again
    once one of them stops may succeed (exit 75, EX_TEMPFAIL)."""


class AlreadyServedError(CoresHeldError):
    """This very config is served already, by another server on this host."""


@dataclass(frozen=True)
class Holder:
    """A running server's entry."""

    pid: int
    config: str
    cpus: CPUSet
    endpoint: str = ""  # server.endpoint, where its clients connect
    control: str = ""  # its supervisor's control socket (wire/control.py)

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "config": self.config,
            "cpus": self.cpus.to_plain(),
            "endpoint": self.endpoint,
            "control": self.control,
        }

    def describe(self) -> str:
        return f"pid {self.pid} (config {self.config}) holds CPUs {self.cpus}"

    def already_serving(self, endpoint: str) -> AlreadyServedError:
        """A second start of the config this server serves, refused with what to do."""
        return AlreadyServedError(
            f"it is served already, by pid {self.pid} on {endpoint}: `numaserve status "
            f"--endpoint {endpoint}` shows that server, `numaserve stop --endpoint {endpoint}` "
            "stops it"
        )


def ledger_dir(environ: Mapping[str, str] = os.environ, create: bool = True) -> Path | None:
    """$NUMASERVE_LEDGER if set; else /run/numaserve, which every server on the host sees;
    else, for a user who may not write there, $XDG_RUNTIME_DIR/numaserve (that user's servers
    only). None: nowhere to write one. `create`: False for a command that only reads it."""
    if environ.get(LEDGER_ENV):
        candidates = [Path(environ[LEDGER_ENV])]
    else:
        candidates = [SYSTEM_DIR]
        if environ.get("XDG_RUNTIME_DIR"):
            candidates.append(Path(environ["XDG_RUNTIME_DIR"]) / "numaserve")
    for path in candidates:
        if not create:
            if path.is_dir():
                return path
        elif _made(path) and os.access(path, os.W_OK | os.X_OK):
            return path
    return None


def _made(path: Path) -> bool:
    try:
        path.mkdir(mode=0o755, exist_ok=True)
    except OSError:
        return False
    return True


def held_cpus(plan: Plan, topo: CPUTopology) -> CPUSet:
    """What a plan holds: every thread of every physical core it uses (an instance's core,
    or a reserved one), so that no other server gets an idle SMT sibling of our cores."""
    used = CPUSet.union(slot.cpus for slot in plan.slots) | plan.reserved_cpus
    return used.whole_cores(topo)


def without(topo: CPUTopology, holders: list[Holder]) -> CPUTopology:
    """The topology a server plans on: the CPUs other servers hold are not allowed."""
    held = CPUSet.union(h.cpus for h in holders)
    return dataclasses.replace(topo, allowed_cpus=topo.allowed_cpus - held)


def plan_around(
    ledger: Ledger | None,
    topo: CPUTopology,
    placement: PlacementConfig,
    models: tuple[ServedModel, ...] = (),
    named: bool | None = None,
    serving: Holder | None = None,
) -> tuple[CPUTopology, Plan, list[Holder]]:
    """The plan on what the other servers leave, and the topology it was made on (a reload
    plans on the same). A plan that would fit on the whole machine, but not in what is left,
    is a CoresHeldError naming the holders; one that would not fit anyway, the plain error.
    `serving`: the server of this very config, whose CPUs count as free (`numaserve plan`)."""
    holders = [h for h in (ledger.holders() if ledger else []) if h != serving]
    free = without(topo, holders)
    try:
        return free, plan_placement(free, placement, models, named), holders
    except PlacementError as e:
        if not holders:
            raise
        plan_placement(topo, placement, models, named)  # raises, with what it could ever hold
        who = "; ".join(h.describe() for h in holders)
        raise CoresHeldError(
            f"{e}. Other numaserve servers on this host hold CPUs (ledger "
            f"{ledger.directory if ledger else '-'}): "
            f"{who}. Stop one of them, or ask for fewer instances here"
        ) from None


class Ledger:
    def __init__(self, directory: Path):
        self.directory = directory
        self._entry: int | None = None  # our entry's open, locked file descriptor
        self._mine: Holder | None = None  # what our entry says

    @contextmanager
    def locked(self) -> Iterator[None]:
        """No other server reads or registers meanwhile."""
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def holders(self) -> list[Holder]:
        """The other live servers' entries; dead servers' entries are removed on the way."""
        found = []
        for path in sorted(self.directory.glob("server-*.json")):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # its server stopped meanwhile
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # locked: its server is alive
                    holder = _parse(os.read(fd, 1 << 20))
                    if holder is not None and holder.pid != os.getpid():
                        found.append(holder)
                    continue
                path.unlink(missing_ok=True)  # nobody holds it: its server is dead
                path.with_suffix(".sock").unlink(missing_ok=True)
            except PermissionError:  # another user's dead server's: left for them
                pass
            finally:
                os.close(fd)
        return found

    def serving(self, config: str) -> Holder | None:
        """The live server of this config file, if another one serves it."""
        path = os.path.abspath(config)
        return next((h for h in self.holders() if h.config == path), None)

    def serving_at(self, endpoint: str) -> Holder | None:
        """The live server on this host that a client of `endpoint` reaches, if any."""
        return next(
            (h for h in self.holders() if h.endpoint and reaches(h.endpoint, endpoint)), None
        )

    def control_path(self) -> Path:
        """Where our supervisor's control socket goes: beside our entry."""
        return self.directory / f"server-{os.getpid()}.sock"

    def register(self, config: str, cpus: CPUSet, endpoint: str = "", control: str = "") -> Path:
        """Our entry, locked until `release` or our death. Written and locked before it takes
        its name, so no reader ever sees it unlocked or half written."""
        self._mine = Holder(os.getpid(), config, cpus, endpoint, control)
        final = self.directory / f"server-{os.getpid()}.json"
        temporary = self.directory / f".server-{os.getpid()}.json.new"
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(self._mine.to_json()).encode())
        os.rename(temporary, final)
        previous, self._entry = self._entry, fd
        if previous is not None:  # an update: the replaced file's lock goes with it
            os.close(previous)
        return final

    def update(self, cpus: CPUSet) -> None:
        """Our entry, now holding `cpus` (a reload added or removed models): replaced whole,
        so a reader sees the old entry or the new, never neither. Under `locked`."""
        mine = self._mine
        if mine is None:
            raise RuntimeError("Ledger.update before register: there is no entry of ours")
        self.register(mine.config, cpus, mine.endpoint, mine.control)

    def release(self) -> None:
        if self._entry is not None:
            (self.directory / f"server-{os.getpid()}.json").unlink(missing_ok=True)
            os.close(self._entry)
            self._entry = None


def _parse(data: bytes) -> Holder | None:
    try:
        body = json.loads(data)
        return Holder(
            int(body["pid"]),
            str(body["config"]),
            CPUSet.from_plain(body["cpus"]),
            str(body.get("endpoint", "")),
            str(body.get("control", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None  # not ours to judge; a live server's unreadable entry is left alone
