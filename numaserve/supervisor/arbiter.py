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
import tempfile
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from pathlib import Path

from numaserve import curve, exitcodes, protocol
from numaserve.config import Config
from numaserve.host.cpulist import format_cpulist
from numaserve.host.ledger import LEDGER_ENV, SYSTEM_DIR, Ledger, held_cpus, ledger_dir, plan_around
from numaserve.host.placement import Plan
from numaserve.host.topology import CPUTopology, read_topology
from numaserve.lifecycle import PARENT_ENV
from numaserve.logs import FORMAT_ENV, LEVEL_ENV
from numaserve.monitoring.endpoint import MonitoringEndpoint
from numaserve.specs import Deployment, RouterSpec, WorkerSpec, deployment
from numaserve.supervisor import reporting
from numaserve.supervisor.children import Child, State, after_crash, describe_exit
from numaserve.supervisor.processes import System
from numaserve.supervisor.reload import Reload, plan_reload
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.router_link import RouterLink, ShardLinks, ShardView
from numaserve.supervisor.sdnotify import Notifier

log = logging.getLogger("numaserve.supervisor")
POLL_ROUTER_S = 0.25
FAST_STOP_EXIT = 128 + signal.SIGINT
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
    ):
        """`plan`: placed by the caller, once (start(): around other servers' cores).
        `monitor`: where each turn's Snapshot goes (server.metrics); none when it is off.
        `ledger`: the host's core ledger, where our entry is (updated when a reload adds
        models)."""
        self.config_path, self.config, self.topo = config_path, config, topo
        self.runtime_dir = runtime_dir
        self.system = system
        self.connect = connect
        self.ledger = ledger
        self.plan = plan
        self.deployment = self.deploy(config, plan)
        self.notifier = notifier or Notifier()
        self.monitor = monitor
        self.shards = ShardLinks(POLL_ROUTER_S)
        for spec in self.deployment.routers:
            self.add_shard(spec)
        frontend = self.deployment.frontend
        self.frontend = Child("frontend", frontend.argv(), cpus=frontend.cpus) if frontend else None
        self.workers = {spec.name: self.worker_child(spec) for spec in self.deployment.workers}
        self.retired: list[Child] = []  # replaced during a reload, still finishing
        self.prepare: Child | None = None  # `numaserve prepare`, before the instances start
        self.next_watchdog = 0.0
        self.mood = Mood.STARTING
        self.fast = False  # the stop under way kills rather than drains
        self.exit_code: int | None = None
        self.reload: Reload | None = None
        self.last_status = ""
        self.failure_code = 0
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
        child = Child(
            f"router-{spec.shard}" if spec.frontend else "router",
            spec.argv(),
            cpus=spec.cpus,
            nodes=spec.nodes,
            shard=spec.shard,
            model_name=spec.model_name,
        )
        self.shards.views.append(ShardView(child, self.connect(spec.workers_endpoint)))
        return self.shards[-1]

    @staticmethod
    def worker_child(spec: WorkerSpec) -> Child:
        return Child(
            spec.name, spec.argv(), spec.pool, spec.cpus, spec.nodes, spec.shard, spec.model_name
        )

    @property
    def routers(self) -> list[Child]:
        """The router shards' processes (one, by default)."""
        return [shard.child for shard in self.shards]

    @property
    def stopping(self) -> bool:
        return self.mood is Mood.STOPPING

    def _front(self) -> list[Child]:
        """The processes between the clients and the workers: the shards, and the frontend."""
        return [*self.routers, *([self.frontend] if self.frontend else [])]

    def all_children(self) -> list[Child]:
        current = [*self._front(), *self.workers.values(), *self.retired]
        if self.prepare:
            current.append(self.prepare)
        if self.reload and self.reload.replacement:
            current.append(self.reload.replacement)
        return current

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        self.system.catch(CAUGHT)
        self.begin()
        while self.exit_code is None:
            self.step(self.system.wait(0.1))
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
        if any(m.backend == "onnxruntime" for m in self.config.served):
            self.mood = Mood.PREPARING
            self._start_prepare()
        else:
            self._start_all()

    def _start_all(self) -> None:
        for child in [*([self.frontend] if self.frontend else []), *self.routers]:
            self.spawn(child)
        for child in self.workers.values():
            self.spawn(child)

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
        if self.stopping:
            self.fast_stop()
        else:
            self.begin_stop("SIGINT (again for a fast stop)")

    def handle_sighup(self) -> None:
        self.begin_reload()

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
            self._set(child, State.FATAL, f"fatal: {child.name} cannot be started: {e}", "fatal")
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
        self._set(
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
        if self.reload and child is self.reload.replacement:
            self.abort_reload(f"the new {child.name} {child.last_exit} before it was ready")
            return
        expected = child.state in (State.DRAINING, State.STOPPED) or self.fast
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
            self._set(child, State.FATAL, f"fatal: {child.name} {verdict.why}", "fatal")
        else:
            child.retry_at = now + verdict.delay
            self._set(child, State.BACKOFF, f"backoff {child.name}: {verdict.why}", "backoff")

    def _check_viable(self) -> None:
        """With a router shard, the frontend or every worker FATAL, the server cannot serve as
        planned: stop, and say so."""
        if self.stopping:
            return
        workers = list(self.workers.values())
        front = self._front()
        if any(c.state == State.FATAL for c in front) or all(
            w.state == State.FATAL for w in workers
        ):
            codes = {c.exit_code for c in [*front, *workers] if c.state == State.FATAL}
            code = codes.pop() if len(codes) == 1 and codes <= exitcodes.NEVER_RESTART else 1
            log.error(
                "fatal: no instance can serve; stopping (exit %d)", code, extra={"event": "fatal"}
            )
            self.begin_stop("no instance can serve")
            self.failure_code = code

    def _set(self, child: Child, state: State, message: str, event: str) -> None:
        """A state change the shards and the log hear of at once."""
        child.change_state(state, self.system.now())
        self.send_slots()
        level = logging.ERROR if state == State.FATAL else logging.INFO
        log.log(level, "%s", message, extra={"event": event, "instance": child.name})

    # -- preparing the model -----------------------------------------------------------------

    def _start_prepare(self) -> None:
        """Build or verify the model's ONNX artifact before any instance starts, so that the
        build never runs inside an instance's start timeout (nor once per instance): by
        `numaserve prepare`, in a process of its own, which leaves the supervisor small (the
        build imports torch) and, during a reload, the running instances serving."""
        argv = [sys.executable, "-m", "numaserve.cli", "prepare", "--config", self.config_path]
        self.prepare = Child("prepare", argv)
        self.spawn(self.prepare)
        if self.reload and self.prepare is not None:
            log.info(
                "reload: preparing the new or changed model(s) before any instance (re)starts",
                extra={"event": "reload"},
            )

    def _prepared(self, code: int) -> None:
        self.prepare = None
        if self.stopping:
            return
        if self.reload:
            if code != 0:
                self.abort_reload(f"the changed model could not be prepared (exit {code})")
            else:
                log.info("reload: the changed model's artifact is ready", extra={"event": "reload"})
        elif code != 0:
            log.error(
                "fatal: the model could not be prepared (%s; its log lines above say why)",
                describe_exit(code, killed_by_us=False),
                extra={"event": "fatal"},
            )
            self.exit_code = exitcodes.MODEL
        else:
            self.mood = Mood.STARTING
            self._start_all()

    # -- what the shards, systemd and /metrics hear ------------------------------------------

    def send_slots(self) -> None:
        """Our slot table to every shard, for `numaserve status`: on a timer, and on every
        change of state, so that status never lags what systemd was told."""
        table = {
            "type": protocol.SUPERVISOR,
            "pid": self.system.pid(),
            # so that `numaserve stop` signals this process and no other
            **self.system.identity(),
            "state": self.summary(),
            "slots": [c.describe() for c in self.workers.values()],
        }
        self.shards.send(table, self.system.now())

    def summary(self) -> str:
        return reporting.summary(self.mood, self.workers.values(), self.routers)

    def snapshot(self, now: float):
        """The current processes: not those a reload retired, nor a replacement still
        starting under its slot's name."""
        kinds = [("router", c) for c in self.routers]
        kinds += [("frontend", self.frontend)] if self.frontend else []
        kinds += [("prepare", self.prepare)] if self.prepare else []
        kinds += [("worker", c) for c in self.workers.values()]
        return reporting.snapshot(
            now, self.config, self.mood, kinds, self.shards, self.system.pid()
        )

    def _notify(self, now: float) -> None:
        workers = list(self.workers.values())
        serving = all(c.state == State.READY for c in self._front()) and any(
            w.state == State.READY for w in workers
        )
        settled = all(w.state in (State.READY, State.FATAL) for w in workers)
        status = self.summary()
        # Every shard must have our latest slot table before systemd hears READY=1, so
        # that `numaserve status` asked right after it shows what systemd was told.
        current = self.shards.all_acked(self.shards.sent)
        if serving and settled and current and self.mood is Mood.STARTING:
            self.mood = Mood.SERVING
            self.notifier.ready(status)
            log.info(
                "serving on %s: %s", self.config.server.endpoint, status, extra={"event": "serving"}
            )
        elif status != self.last_status:
            self.notifier.status(status)
        self.last_status = status
        interval = self.notifier.watchdog_interval
        if interval and now >= self.next_watchdog:
            self.next_watchdog = now + interval
            self.notifier.watchdog()

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        routed = self.shards.routed_pids(now)
        self._front_ready(routed)
        for child in [
            *self.workers.values(),
            *([self.reload.replacement] if self.reload and self.reload.replacement else []),
        ]:
            heard = routed.get(child.shard)
            if child.state == State.STARTING:
                self._check_started(child, now, heard)
            elif child.state == State.READY and heard is not None and not self.stopping:
                self._check_heard(child, now, heard)
        for child in self.all_children():
            self._timers(child, now)
        self._check_viable()  # after any exit, and a spawn that failed
        if self.reload and self.reload.advance(self, now):
            self._reloaded()
        if self.stopping:
            self._advance_stop()
        self._notify(now)

    def _front_ready(self, routed: dict[int, set[int] | None]) -> None:
        """A shard is READY once it answers; the frontend once any shard does: the shards
        start after it, and it has no socket of its own to the supervisor; a frontend that
        cannot listen exits first."""
        endpoint = self.config.server.endpoint
        for router in self.routers:
            if router.state == State.STARTING and routed[router.shard] is not None:
                self._set(
                    router, State.READY, f"ready {router.name}, clients on {endpoint}", "ready"
                )
        frontend = self.frontend
        answered = any(pids is not None for pids in routed.values())
        if frontend and frontend.state == State.STARTING and answered:
            self._set(frontend, State.READY, f"ready frontend, clients on {endpoint}", "ready")

    def _timers(self, child: Child, now: float) -> None:
        """SIGKILL for one that did not stop in time; the restart of one in BACKOFF."""
        if (
            child.term_sent_at is not None
            and child.pid is not None
            and now - child.term_sent_at > self._kill_after(child)
        ):
            log.warning("%s did not stop in time: SIGKILL", child.name, extra={"event": "kill"})
            self.signal(child, signal.SIGKILL)
            child.term_sent_at = float("inf")  # once
        if child.state == State.BACKOFF and now >= child.retry_at and not self.stopping:
            child.restarts += 1
            log.info(
                "restart %s (restart %d)", child.name, child.restarts, extra={"event": "restart"}
            )
            self.spawn(child)

    def _check_started(self, child: Child, now: float, routed: set[int] | None) -> None:
        """STARTING -> READY once the router hears it; killed after start_timeout_s."""
        timeout = self.config.supervisor.start_timeout_s
        if routed is not None and child.pid in routed:
            message = f"ready {child.name} pid {child.pid} in {now - child.started_at:.1f} s"
            self._set(child, State.READY, message, "ready")
        elif now - child.started_at > timeout and child.term_sent_at is None:
            log.warning(
                "%s not ready after %.0f s: killing it",
                child.name,
                timeout,
                extra={"event": "timeout"},
            )
            child.term_sent_at = now
            self.signal(child, signal.SIGKILL)

    def _check_heard(self, child: Child, now: float, routed: set[int]) -> None:
        """A READY instance the router stops hearing (hung, or stopped) gets SIGTERM, then
        SIGKILL; its exit then restarts it."""
        server = self.config.server
        silence_limit = 2 * server.heartbeat_ms * server.heartbeat_liveness / 1000 + 1
        if child.pid in routed:
            child.unrouted_since = None
        elif child.unrouted_since is None:
            child.unrouted_since = now
        elif now - child.unrouted_since > silence_limit and child.term_sent_at is None:
            log.warning(
                "%s stopped heartbeating: SIGTERM, then SIGKILL",
                child.name,
                extra={"event": "hung"},
            )
            child.term_sent_at = now
            self.signal(child, signal.SIGTERM)

    def _kill_after(self, child: Child) -> float:
        s = self.config.supervisor
        draining = child in self.routers or bool(self.reload and child in self.reload.draining)
        return s.drain_timeout_s + s.kill_timeout_s if draining else s.kill_timeout_s

    # -- stopping ----------------------------------------------------------------------------

    def begin_stop(self, why: str) -> None:
        if self.stopping:
            return
        if self.reload:
            self.abort_reload("stopping")
        self.mood = Mood.STOPPING
        self.failure_code = 0
        if self.prepare:
            self.terminate(self.prepare)
        log.info(
            "drain: %s: the router shards finish requests in flight (%.0f s at most), then the "
            "workers stop",
            why,
            self.config.supervisor.drain_timeout_s,
            extra={"event": "drain"},
        )
        self.notifier.stopping("draining")
        for router in self.routers:
            if router.pid is not None:
                self.terminate(router)
            elif router.state != State.FATAL:
                router.change_state(State.STOPPED, self.system.now())

    def _advance_stop(self) -> None:
        if any(router.pid is not None for router in self.routers):
            return  # still draining; the frontend carries their last replies
        live = [c for c in self.all_children() if c.pid is not None]
        for child in live:
            if child.term_sent_at is None:
                self.terminate(child)
        if not live:
            for child in self.all_children():
                if child.state != State.FATAL:
                    child.change_state(State.STOPPED, self.system.now())
            log.info("stopped", extra={"event": "stopped"})
            self.exit_code = FAST_STOP_EXIT if self.fast else self.failure_code

    def fast_stop(self) -> None:
        log.warning(
            "fast stop: killing every process now; requests in flight are lost",
            extra={"event": "fast-stop"},
        )
        self.fast = True
        for child in self.all_children():
            child.term_sent_at = float("inf")
            self.signal(child, signal.SIGKILL)

    # -- reloading (reload.py) ---------------------------------------------------------------

    def begin_reload(self) -> None:
        if self.stopping:
            return
        if self.reload or self.prepare:
            what = "reload" if self.reload else "preparing the model"
            log.info("%s already under way; SIGHUP ignored", what, extra={"event": "reload"})
            return
        self.reload = plan_reload(self)
        if self.reload is None:
            return
        self.mood = Mood.RELOADING
        self.notifier.reloading("reloading")
        before = {m.name: m.model for m in self.config.served}
        if any(
            m.backend == "onnxruntime" and m.model != before.get(m.name)
            for m in self.reload.config.served
        ):
            self._start_prepare()

    def _reloaded(self) -> None:
        self.config = self.reload.config
        self.reload = None
        log.info("reload: done", extra={"event": "reload"})
        self.mood = Mood.STARTING  # READY=1 again for systemd, once it serves

    def hold(self, plan: Plan) -> None:
        """Our ledger entry, holding what `plan` holds."""
        if not self.ledger:
            return
        try:
            with self.ledger.locked():
                self.ledger.update(held_cpus(plan, self.topo))
        except OSError as e:
            log.error(
                "the core ledger entry could not be updated: %s", e, extra={"event": "ledger"}
            )

    def abort_reload(self, why: str) -> None:
        r, self.reload = self.reload, None
        if r:
            self.mood = r.resume
        if r and r.by_model and not r.reshaped and r.plan != self.plan:
            self.hold(self.plan)  # the cores it would have added are not ours
        if self.prepare is not None:
            self.retired.append(self.prepare)  # reaped as a replaced process
            self.terminate(self.prepare)
            self.prepare = None
        if r and r.replacement and r.replacement.pid is not None:
            self.retired.append(r.replacement)
            self.terminate(r.replacement)
        log.error(
            "reload aborted (%s); the running instances keep serving",
            why,
            extra={"event": "reload"},
        )

    def close(self) -> None:
        self.shards.close()
        self.notifier.close()


def start(config_path: str, config: Config) -> int:
    """`numaserve start`: plan once, supervise, return the exit code. `config`: read from
    `config_path` by the caller (a reload reads the file again). Raises PlacementError,
    CurveError or MonitoringError for a config that cannot run here (before anything
    starts)."""
    topo = read_topology()
    for warning in topo.warnings:
        log.warning("topology: %s", warning)
    if config.server.curve:  # fail here: a shard or frontend would only exit with it
        curve.server_keys(
            config.server.curve.secret_key_file, config.server.curve.authorized_keys_dir
        )
    directory = ledger_dir()
    if directory is None:
        log.warning(
            "no core ledger: neither $%s, %s nor $XDG_RUNTIME_DIR/numaserve is writable, so "
            "other numaserve servers on this host cannot see this one's CPUs, nor it theirs",
            LEDGER_ENV,
            SYSTEM_DIR,
        )
    ledger = Ledger(directory) if directory else None
    with ExitStack() as cleanup:  # undone in reverse: the ledger's entry goes last
        with ledger.locked() if ledger else nullcontext():
            # Planned here, with the CLI's clear message if it does not fit.
            topo, plan, holders = plan_around(ledger, topo, config.placement, config.models)
            if ledger:
                ledger.register(os.path.abspath(config_path), held_cpus(plan, topo))
                cleanup.callback(ledger.release)
        for holder in holders:
            log.info(
                "planned around another server: %s", holder.describe(), extra={"event": "ledger"}
            )
        monitor = MonitoringEndpoint(config.server.metrics) if config.server.metrics else None
        if monitor is not None:
            cleanup.callback(monitor.close)
        runtime_dir = Path(tempfile.mkdtemp(prefix="numaserve-"))  # the routers' private sockets
        cleanup.callback(_remove, runtime_dir)
        system = System()
        cleanup.callback(system.close)
        if monitor is not None:
            monitor.start()
        supervisor = Supervisor(
            config_path,
            config,
            topo,
            plan,
            runtime_dir,
            system=system,
            monitor=monitor,
            ledger=ledger,
        )
        return supervisor.run()


def _remove(runtime_dir: Path) -> None:
    for path in runtime_dir.glob("*"):
        path.unlink(missing_ok=True)
    runtime_dir.rmdir()
