"""A supervisor on a fake OS, for testing its state machine without processes.

FAKE OS, said plainly: no process is started and no signal is sent. Files the supervisor
writes through its System (the frontend's routes on a reload) are written for real, in the
test's own directory. `FakeSystem` stands in for
supervisor/processes.py (processes, signals, the clock), `FakeRouter` for the router at the
other end of supervisor/router_link.py, `FakeNotifier` for systemd. The tests decide when a
process exits and with what code; the clock moves only when they move it. The slow suite
(tests/test_supervisor.py) runs the same supervisor with real processes.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import replace
from pathlib import Path

from numaserve.config.ports import AS_WRITTEN, Ports
from numaserve.config.schema import load_config
from numaserve.host.cpuset import CPUSet
from numaserve.host.ledger import Ledger
from numaserve.host.placement import plan_placement
from numaserve.host.topology import read_topology
from numaserve.status.report import ShardReport
from numaserve.supervisor.arbiter import Supervisor
from numaserve.supervisor.control import ControlSocket
from numaserve.supervisor.processes import System
from numaserve.wire import protocol
from tests.harness.reports import report

MACHINE = Path(__file__).parent.parent / "fixtures" / "sysfs" / "xeon_e2288g_smt_off"  # 8 cores

CONFIG = """
model: {{path: bundled:minilm, backend: {backend}, quantize: none}}
server: {{heartbeat_ms: 500, heartbeat_liveness: 3, routers: {routers}, http: "{http}"}}
supervisor:
  drain_timeout_s: 30
  start_timeout_s: 60
  kill_timeout_s: 10
  stable_s: 5
  max_quick_exits: {max_quick_exits}
  backoff_initial_s: 0.5
  backoff_max_s: 4
placement:
  pools: [{{name: main, max_tokens: 512, instances: {instances}}}]
"""


def spec_of(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--spec") + 1])


def process_name(argv: list[str]) -> str:
    """The slot a command line runs ("main-0"), its router ("router", or "router-N" of several
    shards), "frontend", a front ("front-N") or "prepare": the names the supervisor gives
    them."""
    if "prepare" in argv:
        return "prepare"
    spec = spec_of(argv)
    if "routes" in spec:
        return "frontend"
    if "named" in spec:  # a FrontSpec
        return f"front-{spec.get('index', 0)}"
    if "workers_endpoint" in spec:
        return f"router-{spec['shard']}" if spec.get("frontend") else "router"
    return spec["slot"]["name"]


class FakeSystem:
    """Processes that run until a test (or a SIGKILL: the kernel's part) ends them."""

    def __init__(self) -> None:
        self.time = 1000.0
        self.next_pid = 100
        self.running: dict[int, str] = {}  # pid -> process name
        self.argv: dict[int, list[str]] = {}
        self.exited: list[tuple[int, int]] = []  # not yet reaped
        self.sent: list[tuple[str, int]] = []  # (process name, signal), in order
        self.spawn_error: OSError | None = None
        self.cannot_listen: set[str] = set()  # fronts that never write their stats file

    def now(self) -> float:
        return self.time

    @staticmethod
    def pid() -> int:
        return 1

    @staticmethod
    def identity() -> dict:
        return {"boot_id": "fake-boot", "started": 1}

    def catch(self, signals) -> None:
        pass

    def wait(self, timeout: float) -> list[int]:
        self.time += timeout
        return []

    def spawn(self, argv: list[str], env: dict[str, str], new_session: bool) -> int:
        if self.spawn_error:
            raise self.spawn_error
        self.next_pid += 1
        self.running[self.next_pid] = process_name(argv)
        self.argv[self.next_pid] = argv
        name = self.running[self.next_pid]
        spec = spec_of(argv) if "--spec" in argv else {}
        if spec.get("stats_file") and name not in self.cannot_listen:  # a front listens
            System.write_file(spec["stats_file"], json.dumps({"pid": self.next_pid}))
        return self.next_pid

    write_file = staticmethod(System.write_file)  # a real file, in the test's directory
    read_file = staticmethod(System.read_file)

    def affinity(self, pid: int) -> CPUSet | None:
        """Where the process was placed: its spec's CPUs (a fake kernel keeps every pin)."""
        if pid not in self.running or "--spec" not in self.argv[pid]:
            return None
        spec = spec_of(self.argv[pid])
        return CPUSet((spec.get("slot") or spec)["binding"]["cpus"])

    def kill(self, pid: int, sig: int) -> None:
        if pid in self.running:
            self.sent.append((self.running[pid], sig))
            if sig == signal.SIGKILL:
                self.exit(pid, -signal.SIGKILL)

    def exit(self, pid: int, code: int) -> None:
        """The process ends: `code` as os.waitstatus_to_exitcode gives it (-N: signal N)."""
        del self.running[pid]
        self.exited.append((pid, code))

    def reap(self) -> list[tuple[int, int]]:
        exited, self.exited = self.exited, []
        return exited

    def close(self) -> None:
        pass

    def pid_of(self, name: str) -> int | None:
        return next((pid for pid, n in self.running.items() if n == name), None)

    def signals_to(self, name: str) -> list[int]:
        return [sig for n, sig in self.sent if n == name]


class FakeRouter:
    """Answers each slot table while its router process (`name`) runs, hearing every running
    worker of its shard but those in `quiet` (loading, or hung), by name or pid."""

    def __init__(self, system: FakeSystem, name: str = "router", shard: int = 0) -> None:
        self.system = system
        self.name, self.shard = name, shard
        self.quiet: set[str | int] = set()  # process names or pids
        self.behind = False  # busy: answers nothing yet (the tables wait, as in its socket)
        self.tables: list[dict] = []  # every slot table the supervisor sent
        self.unanswered: list[tuple[int, bool]] = []  # (seq, whether it asks for the report)
        # Its report, but routed_pids (a test may set it; None: it sends none, a bug).
        self.status: ShardReport | None = report(shard)
        self.asking: list[dict] = []  # what it sends next besides its answers (a WHOLE query)
        self.wholes: list[dict] = []  # the supervisor's answers to those

    def send(self, message: dict) -> None:
        if message["type"] == protocol.WHOLE:
            self.wholes.append(message)
            return
        self.tables.append(message)
        if self.name in self.system.running.values():  # else lost, as on a real socket
            self.unanswered.append((message["seq"], message["report"]))

    def receive(self) -> list[dict]:
        """Answers to the tables received, as the router sees its workers now."""
        if self.name not in self.system.running.values():
            self.unanswered = []
        if self.behind:
            return []
        heard = [
            pid
            for pid, name in self.system.running.items()
            if not name.startswith(("router", "frontend", "prepare"))
            and spec_of(self.system.argv[pid]).get("shard", 0) == self.shard
            and not {name, pid} & self.quiet
        ]
        routed = sorted(heard)
        status = self.status and replace(self.status, routed_pids=tuple(routed)).to_wire()
        answers = [
            {"type": protocol.STATUS, "seq": seq, "routed_pids": routed}
            | ({"server": status} if report and status else {})
            for seq, report in self.unanswered
        ]
        self.unanswered = []
        answers, self.asking = answers + self.asking, []
        return answers

    def close(self) -> None:
        pass


class FakeNotifier:
    """Records what systemd would be told."""

    watchdog_interval = None

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def _record(self, kind: str, status: str = "") -> bool:
        self.sent.append((kind, status))
        return True

    def ready(self, status: str) -> bool:
        return self._record("READY", status)

    def status(self, status: str) -> bool:
        return self._record("STATUS", status)

    def stopping(self, status: str) -> bool:
        return self._record("STOPPING", status)

    def reloading(self, status: str) -> bool:
        return self._record("RELOADING", status)

    def watchdog(self) -> bool:
        return self._record("WATCHDOG")

    def close(self) -> None:
        pass

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.sent if kind != "STATUS"]


class FakeMonitor:
    """Keeps what the supervisor publishes for /metrics and the probes."""

    def __init__(self) -> None:
        self.snapshots: list = []

    def publish(self, snapshot) -> None:
        self.snapshots.append(snapshot)

    @property
    def latest(self):
        return self.snapshots[-1]


class Rig:
    """A Supervisor wired to the fakes, with a config file it can reload."""

    def __init__(
        self,
        directory: Path,
        instances: int = 2,
        max_quick_exits: int = 3,
        backend="torch",
        routers: int | str = "auto",  # auto: one shard on this one-node machine
        config_text: str | None = None,  # instead of CONFIG
        ledger: Ledger | None = None,  # a real one, in a test's directory
        http: str = "",  # server.http: off unless a test is about the HTTP fronts
        ports: Ports = AS_WRITTEN,  # what `numaserve start`'s command line moved
        control: ControlSocket | None = None,  # a real one, in a test's directory
    ):
        self.config_path = directory / "numaserve.yaml"
        self.routers_setting = routers
        self.http = http
        if config_text is None:
            self.write_config(instances=instances, max_quick_exits=max_quick_exits, backend=backend)
        else:
            self.config_path.write_text(config_text)
        self.os = FakeSystem()
        self.shards: list[FakeRouter] = []  # one per router shard, in the order connected
        self.notifier = FakeNotifier()
        self.monitor = FakeMonitor()
        self.sup_config = ports.apply(load_config(self.config_path))
        topo = read_topology(MACHINE)
        self.sup = Supervisor(
            str(self.config_path),
            self.sup_config,
            topo,
            plan_placement(
                topo, self.sup_config.placement, self.sup_config.models, self.sup_config.named
            ),
            directory,
            system=self.os,
            connect=self._connect,
            notifier=self.notifier,
            monitor=self.monitor,
            environ={},
            ledger=ledger,
            ports=ports,
            control=control,
        )

    def _connect(self, endpoint: str) -> FakeRouter:
        """The supervisor's link to a shard: its number is in its endpoint's name."""
        shard = int(re.search(r"workers-(\d+)\.sock$", endpoint).group(1))
        behind_frontend = self.sup_config.named or (
            self.routers_setting != "auto" and self.routers_setting > 1
        )
        name = f"router-{shard}" if behind_frontend else "router"
        self.shards.append(FakeRouter(self.os, name, shard))
        return self.shards[-1]

    @property
    def router(self) -> FakeRouter:
        """The first (by default, the only) shard."""
        return self.shards[0]

    def write_config(self, instances=2, max_quick_exits=3, backend="torch") -> None:
        self.config_path.write_text(
            CONFIG.format(
                instances=instances,
                max_quick_exits=max_quick_exits,
                backend=backend,
                routers=self.routers_setting,
                http=self.http,
            )
        )

    def step(self, *signals: int, seconds: float = 0.0) -> None:
        """Move the clock, then one turn of the supervisor's loop."""
        self.os.time += seconds
        self.sup.step(list(signals))

    def run_for(self, seconds: float, every: float = 0.1) -> None:
        for _ in range(round(seconds / every)):
            self.step(seconds=every)

    def start(self) -> None:
        """Start every process and turn the loop until all are READY."""
        self.sup.begin()
        self.step()  # the router answers, and hears the workers
        assert self.states() == {name: "ready" for name in self.sup.roster.workers}, self.states()

    def states(self) -> dict[str, str]:
        return {name: c.state.value for name, c in self.sup.roster.workers.items()}

    def pid(self, name: str) -> int:
        pid = (
            self.sup.roster.routers[0].pid
            if name == "router"
            else self.sup.roster.workers[name].pid
        )
        assert pid is not None, f"{name} is not running"
        return pid

    def exit(self, name: str, code: int) -> None:
        """The process of `name` ends with `code`; the next step reaps it."""
        self.os.exit(self.pid(name), code)

    def restart_after(self, delay: float) -> None:
        """Let a backoff pass: the slot restarts, and the router hears it."""
        self.step(seconds=delay)
        self.step()

    def crash(self, name: str, code: int = 1) -> float:
        """`name` exits with `code`; returns the backoff the supervisor chose (or 0)."""
        self.exit(name, code)
        self.step()
        child = self.sup.roster.workers.get(name, self.sup.roster.routers[0])
        return round(child.retry_at - self.os.time, 6) if child.state.value == "backoff" else 0.0
