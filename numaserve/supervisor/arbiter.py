"""The supervisor's loop: runs a Plan as processes and keeps them running.

After gunicorn's arbiter: signal handlers only enqueue (processes.py), and the loop dispatches
to `handle_<signal>`; exited children are reaped in a loop. Each slot moves through the states
of children.py (`Child.change_state`, guarded), on events (spawned, heard by the router,
exited, a signal) and the clock; the server as a whole has one Mood (reporting.py). A reload's
phases are reload.py's.

All of its effects go through a System (processes, signals, files, the clock), a RouterLink
per router shard and a Notifier, so that the tests drive the whole state machine with fakes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from numaserve import exitcodes, protocol
from numaserve.config import Config
from numaserve.config_ports import AS_WRITTEN, Ports
from numaserve.config_precision import needs_prepare
from numaserve.host.cpulist import format_cpulist
from numaserve.host.ledger import Ledger
from numaserve.host.placement import Plan
from numaserve.host.topology import CPUTopology
from numaserve.lifecycle import PARENT_ENV
from numaserve.logs import FORMAT_ENV, LEVEL_ENV
from numaserve.monitoring.endpoint import MonitoringEndpoint
from numaserve.specs import Deployment, RouterSpec, deployment
from numaserve.supervisor import liveness, reporting
from numaserve.supervisor.children import Child, State, after_crash, describe_exit
from numaserve.supervisor.processes import System
from numaserve.supervisor.reconcile import Reconcile
from numaserve.supervisor.reload import begin_reload
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.router_link import RouterLink, ShardLinks, ShardView
from numaserve.supervisor.sdnotify import Notifier
from numaserve.supervisor.stop import Stop

log = logging.getLogger("numaserve.supervisor")
PREPARE = (sys.executable, "-m", "numaserve.cli", "prepare")
POLL_ROUTER_S = 0.25
SYSTEMD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")
CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


class Supervisor:
    def __init__(
        self,
        config_path: str,
        config: Config,
        topo: CPUTopology,
        plan: Plan,
        runtime_dir: Path,
        *,
        system: System,
        connect: Callable[[str], RouterLink] = RouterLink,
        notifier: Notifier | None = None,
        monitor: MonitoringEndpoint | None = None,
        environ: Mapping[str, str] = os.environ,
        ledger: Ledger | None = None,
        ports: Ports = AS_WRITTEN,
    ):
        """`plan`: placed by the caller, once (start(): around other servers' cores).
        `ports`: what the command line moved, over the file, at every reload too.
        `monitor`: where each turn's Snapshot goes (server.metrics); none when it is off.
        `ledger`: the host's core ledger, where our entry is (updated when a reload adds
        models)."""
        self.config_path, self.config, self.topo, self.ports = config_path, config, topo, ports
        self.runtime_dir = runtime_dir
        self.system = system
        self.connect = connect
        self.ledger = ledger
        self.plan = plan
        self.deployment = self.deploy(config, plan)
        self.notifier = notifier or Notifier()
        self.announcer = reporting.Announcer(self.notifier)
        self.monitor = monitor
        self.shards = ShardLinks(POLL_ROUTER_S)
        for spec in self.deployment.routers:
            self.add_shard(spec)
        frontend = self.deployment.frontend
        self.frontend = Child.for_frontend(frontend) if frontend else None
        self.http = [Child.for_http(spec) for spec in self.deployment.http]
        self.workers = {w.slot.name: Child.for_worker(w) for w in self.deployment.workers}
        self.retired: list[Child] = []  # replaced during a reload, still finishing
        self.prepare: Child | None = None  # `numaserve prepare`, before the instances start
        self.mood = Mood.STARTING
        self.exit_code: int | None = None
        self.reconcile: Reconcile | None = None  # the start's, or a reload's
        self.stop: Stop | None = None
        # Our environment less systemd's variables (NotifyAccess=main), plus the config's
        # logging settings: the children log as the supervisor does.
        self.child_env = {k: v for k, v in environ.items() if k not in SYSTEMD_VARS} | {
            LEVEL_ENV: config.logging.level,
            FORMAT_ENV: config.logging.format,
        }

    def deploy(
        self, config: Config, plan: Plan, numbers: dict[str, tuple[int, ...]] | None = None
    ) -> Deployment:
        return deployment(config, plan, self.topo, self.runtime_dir, numbers)

    def add_shard(self, spec: RouterSpec) -> ShardView:
        view = ShardView(Child.for_shard(spec), self.connect(spec.workers_endpoint))
        self.shards.views.append(view)
        return view

    @property
    def routers(self) -> list[Child]:
        """The router shards' processes (one, by default)."""
        return [shard.child for shard in self.shards]

    @property
    def stopping(self) -> bool:
        return self.mood is Mood.STOPPING

    @property
    def reloading(self) -> bool:
        return self.reconcile is not None and self.reconcile.reloading

    def front(self) -> list[Child]:
        """The processes between the clients and the workers: the shards, the frontend, and
        the HTTP fronts."""
        return [*self.routers, *([self.frontend] if self.frontend else []), *self.http]

    def all_children(self) -> list[Child]:
        current = [*self.front(), *self.workers.values(), *self.retired]
        if self.prepare:
            current.append(self.prepare)
        if self.reconcile and self.reconcile.replacement:
            current.append(self.reconcile.replacement)
        return current

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        self.system.catch(CAUGHT)
        self.begin()
        while self.exit_code is None:
            self.step(self.system.wait(0.1, [view.link.sock for view in self.shards]))
        self.close()
        return self.exit_code

    def begin(self) -> None:
        """Prepare the model, if it needs it; then start the router and every worker."""
        log.info(
            "starting: %d instance(s), %d router shard(s) on %s, config %s",
            len(self.workers),
            len(self.shards),
            self.config.server.endpoint,
            self.config_path,
            extra={"event": "start"},
        )
        self.reconcile = Reconcile.start(self)
        if any(needs_prepare(m.backend, m.quantize) for m in self.config.models):
            self.mood = Mood.PREPARING
            self.start_prepare()
        else:
            self.reconcile.advance(self, self.system.now())

    def step(self, signals: list[int]) -> None:
        """One turn of the loop: the signals caught since the last, then children that exited,
        the router's answers, and the timers."""
        for signum in signals:
            getattr(self, f"handle_{signal.Signals(signum).name.lower()}")()
        for pid, code in self.system.reap():
            child = next((c for c in self.all_children() if c.pid == pid), None)
            if child is not None:
                self.on_exit(child, code)
        now = self.system.now()
        self.shards.receive(now)
        if now >= self.shards.next_send:
            self.send_slots()
        self.tick(now)
        if self.monitor is not None:
            self.monitor.publish(self.snapshot(now))

    # -- signals -----------------------------------------------------------------------------

    def handle_sigterm(self) -> None:
        self.begin_stop("SIGTERM")

    def handle_sigint(self) -> None:
        if self.stop is not None:
            self.stop.kill(self)
        else:
            self.begin_stop("SIGINT (again for a fast stop)")

    def handle_sighup(self) -> None:
        for front in self.http:  # they read the API keys file again at once
            self.signal(front, signal.SIGHUP)
        begin_reload(self)

    def handle_sigchld(self) -> None:
        pass  # every turn of the loop reaps

    # -- processes ---------------------------------------------------------------------------

    def spawn(self, child: Child) -> None:
        env = self.child_env | {PARENT_ENV: str(self.system.pid())}
        try:
            # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which
            # then stops the children in order (router drains first).
            child.pid = self.system.spawn(child.argv, env, new_session=True)
        except OSError as e:
            self.set_state(
                child, State.FATAL, f"fatal: {child.name} cannot be started: {e}", "fatal"
            )
            if child is self.prepare:
                self._prepared(exitcodes.MODEL)
            return
        child.started_at = self.system.now()
        child.term_sent_at = child.unrouted_since = child.ready_at = None
        child.killed = False
        view = self.shards.of(child)
        if view is not None:
            self.shards.restarted(view)
        where = f" on CPUs {format_cpulist(child.cpus)}" if child.cpus else ""
        nodes = f", node(s) {format_cpulist(child.nodes)}" if child.nodes else ""
        self.set_state(
            child, State.STARTING, f"spawn {child.name} pid {child.pid}{where}{nodes}", "spawn"
        )

    def terminate(self, child: Child, state: State = State.DRAINING) -> None:
        now = self.system.now()
        if child.pid is None:
            child.change_state(State.STOPPED, now)
            return
        child.change_state(state, now)
        child.term_sent_at = now
        self.signal(child, signal.SIGTERM)

    def signal(self, child: Child, sig: int) -> None:
        if child.pid is not None:
            child.killed = child.killed or sig == signal.SIGKILL
            self.system.kill(child.pid, sig)

    def on_exit(self, child: Child, code: int) -> None:
        """`code` is negative for a signal."""
        child.pid = None
        child.exit_code = code
        child.last_exit = describe_exit(code, child.killed)
        if child is self.prepare:
            self._prepared(code)
            return
        if child in self.retired:
            self.retired.remove(child)
            log.info("exit %s (retired): %s", child.name, child.last_exit, extra={"event": "exit"})
            return
        if self.reconcile and child is self.reconcile.replacement:
            self.reconcile.abort(
                self, f"the new {child.name} {child.last_exit} before it was ready"
            )
            return
        expected = child.state in (State.DRAINING, State.STOPPED) or bool(
            self.stop and self.stop.fast
        )
        level = logging.INFO if expected and code == 0 else logging.WARNING
        log.log(
            level,
            "exit %s: %s",
            child.name,
            child.last_exit,
            extra={"event": "exit", "instance": child.name},
        )
        now = self.system.now()
        if expected or self.stopping:
            child.change_state(State.STOPPED, now)
            return
        verdict = after_crash(child, code, now, self.config.supervisor)
        if verdict.state == State.FATAL:
            self.set_state(child, State.FATAL, f"fatal: {child.name} {verdict.why}", "fatal")
        else:
            child.retry_at = now + verdict.delay
            self.set_state(child, State.BACKOFF, f"backoff {child.name}: {verdict.why}", "backoff")

    def set_state(self, child: Child, state: State, message: str, event: str) -> None:
        """A state change the shards and the log hear of at once."""
        child.change_state(state, self.system.now())
        self.send_slots()
        level = logging.ERROR if state == State.FATAL else logging.INFO
        log.log(level, "%s", message, extra={"event": event, "instance": child.name})

    # -- preparing the model -----------------------------------------------------------------

    def start_prepare(self) -> None:
        """Resolve each model once before any instance starts (each pool's path and artifact,
        written where the instances' specs name it): by `numaserve prepare`, in a process of
        its own, which leaves the supervisor small (the build imports torch) and, during a
        reload, the running instances serving; so no build runs in a start timeout."""
        argv = [*PREPARE, "--config", self.config_path, "--record-dir", str(self.runtime_dir)]
        self.prepare = Child("prepare", argv)
        self.spawn(self.prepare)
        if self.reloading and self.prepare is not None:
            log.info(
                "reload: preparing the new or changed model(s) before any instance (re)starts",
                extra={"event": "reload"},
            )

    def _prepared(self, code: int) -> None:
        self.prepare = None
        if self.reconcile and not self.stopping:
            self.reconcile.prepared(self, code)

    # -- what the shards, systemd and /metrics hear ------------------------------------------

    def send_slots(self) -> None:
        """Our slot table to every shard, for `numaserve status`: on a timer, and on every
        change of state, so that status never lags what systemd was told. Each slot's live
        affinity is read here, so that no shard reads /proc in its request loop."""
        table = {
            "type": protocol.SUPERVISOR,
            "pid": self.system.pid(),
            # so that `numaserve stop` signals this process and no other
            **self.system.identity(),
            "state": self.summary(),
            "slots": [
                {**c.describe(), "live_cpus": self.system.affinity(c.pid) if c.pid else None}
                for c in self.workers.values()
            ],
            # Each shard's state: a peer that is stopping takes no handed-over request.
            "routers": [{"shard": c.shard, "state": c.state.value} for c in self.routers],
            # The HTTP fronts, for `numaserve status` to show.
            "http": [
                {"name": c.name, "state": c.state.value, "pid": c.pid, "cpus": list(c.cpus)}
                for c in self.http
            ],
        }
        self.shards.send(table, self.system.now())

    def summary(self) -> str:
        return reporting.summary(self.mood, self.workers.values(), self.routers)

    def snapshot(self, now: float):
        """The current processes: not those a reload retired, nor a replacement still
        starting under its slot's name."""
        kinds = [("router", c) for c in self.routers]
        kinds += [("frontend", self.frontend)] if self.frontend else []
        kinds += [("http", c) for c in self.http]
        kinds += [("prepare", self.prepare)] if self.prepare else []
        kinds += [("worker", c) for c in self.workers.values()]
        stats = tuple(c.spec.stats_file for c in self.http if c.spec.stats_file)
        return reporting.snapshot(
            now, self.config, self.mood, kinds, self.shards, self.system.pid(), stats
        )

    def _notify(self, now: float) -> None:
        workers = list(self.workers.values())
        serving = all(c.state == State.READY for c in self.front()) and any(
            w.state == State.READY for w in workers
        )
        settled = all(w.state in (State.READY, State.FATAL) for w in workers)
        # Every shard must have our latest slot table before systemd hears READY=1, so
        # that `numaserve status` asked right after it shows what systemd was told.
        current = self.shards.all_acked(self.shards.sent)
        ready = serving and settled and current and self.mood is Mood.STARTING
        status = self.summary()
        if ready:
            self.mood = Mood.SERVING
            endpoint = self.config.server.endpoint
            log.info("serving on %s: %s", endpoint, status, extra={"event": "serving"})
        self.announcer.turn(now, status, ready)

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        liveness.check(self, now)
        code = liveness.cannot_serve(self)
        if code is not None:
            self.begin_stop(
                "no instance can serve", code
            )  # after any exit, and a spawn that failed
        if self.reconcile:
            self.reconcile.advance(self, now)
        if self.stop is not None:
            self.exit_code = self.stop.advance(self)
        self._notify(now)

    # -- stopping ----------------------------------------------------------------------------

    def begin_stop(self, why: str, code: int = 0) -> None:
        """`code`: the exit code once stopped, where the stop is a failure."""
        if self.stopping:
            return
        if self.reloading:
            self.reconcile.abort(self, "stopping")
        self.reconcile = None
        self.mood = Mood.STOPPING
        self.stop = Stop(code)
        self.stop.begin(self, why)

    def close(self) -> None:
        self.shards.close()
        self.notifier.close()
