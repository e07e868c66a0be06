"""The supervisor's loop: runs a Plan as processes and keeps them running.

After gunicorn's arbiter: signal handlers only enqueue (processes.py), and the loop dispatches
to `handle_<signal>`; exited children are reaped in a loop. Each slot moves through the states
of children.py, on events (spawned, heard by the router, exited, a signal) and the clock.

All of its effects go through a System (processes, signals, the clock), a RouterLink per
router shard and a Notifier, so that the tests drive the whole state machine with fakes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from pathlib import Path

from numaserve import __version__, curve, exitcodes, protocol
from numaserve.config import Config, ConfigError, load_config
from numaserve.host.cpulist import format_cpulist
from numaserve.host.ledger import (
    LEDGER_ENV,
    SYSTEM_DIR,
    Ledger,
    held_cpus,
    ledger_dir,
    plan_around,
    without,
)
from numaserve.host.placement import PlacementError, Plan, plan_placement, replan
from numaserve.host.topology import CPUTopology, read_topology
from numaserve.lifecycle import PARENT_ENV
from numaserve.logs import FORMAT_ENV, LEVEL_ENV
from numaserve.monitoring.endpoint import MonitoringEndpoint
from numaserve.monitoring.snapshot import Snapshot
from numaserve.specs import Deployment, RouterSpec, WorkerSpec, deployment
from numaserve.supervisor.children import Child, State, after_crash, describe_exit
from numaserve.supervisor.processes import System
from numaserve.supervisor.reload import Reload, model_changes, unapplied_changes
from numaserve.supervisor.router_link import RouterLink, ShardView
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
        runtime_dir: Path,
        *,
        system: System,
        connect: Callable[[str], RouterLink] = RouterLink,
        notifier: Notifier | None = None,
        monitor: MonitoringEndpoint | None = None,
        environ: Mapping[str, str] = os.environ,
        ledger: Ledger | None = None,
    ):
        """`monitor`: where each turn's Snapshot goes (server.metrics); none when it is off.
        `ledger`: the host's core ledger, where our entry is (updated when a reload adds
        models)."""
        self.config_path, self.config, self.topo = config_path, config, topo
        self.runtime_dir = runtime_dir
        self.system = system
        self.connect = connect
        self.ledger = ledger
        self.plan = plan_placement(topo, config.placement, config.models)
        self.deployment = self._deploy(config, self.plan)
        self.notifier = notifier or Notifier()
        self.monitor = monitor
        self.shards = [self._shard(spec) for spec in self.deployment.routers]
        frontend = self.deployment.frontend
        self.frontend = Child("frontend", frontend.argv(), cpus=frontend.cpus) if frontend else None
        self.workers = {spec.name: self._worker_child(spec) for spec in self.deployment.workers}
        self.retired: list[Child] = []  # replaced during a reload, still finishing
        self.prepare: Child | None = None  # `numaserve prepare`, before the instances start
        self.next_poll = 0.0
        self.slots_sent = 0  # sequence number of the latest slot table sent to the shards
        self.next_watchdog = 0.0
        self.stopping = False  # a graceful stop is under way
        self.fast = False
        self.exit_code: int | None = None
        self.reload: Reload | None = None
        self.announced_ready = False
        self.last_status = ""
        self.failure_code = 0
        # Our environment less systemd's variables (NotifyAccess=main), plus the config's
        # logging settings: the children log as the supervisor does.
        self.child_env = {k: v for k, v in environ.items() if k not in SYSTEMD_VARS} | {
            LEVEL_ENV: config.logging.level,
            FORMAT_ENV: config.logging.format,
        }

    def _deploy(
        self, config: Config, plan: Plan, numbers: dict[str, tuple[int, ...]] | None = None
    ) -> Deployment:
        return deployment(config, plan, self.topo, self.runtime_dir, numbers)

    def _shard(self, spec: RouterSpec) -> ShardView:
        return ShardView(self._router_child(spec), self.connect(spec.workers_endpoint))

    @staticmethod
    def _worker_child(spec: WorkerSpec) -> Child:
        return Child(
            spec.name, spec.argv(), spec.pool, spec.cpus, spec.nodes, spec.shard, spec.model_name
        )

    @staticmethod
    def _router_child(spec: RouterSpec) -> Child:
        name = f"router-{spec.shard}" if spec.frontend else "router"
        return Child(
            name,
            spec.argv(),
            cpus=spec.cpus,
            nodes=spec.nodes,
            shard=spec.shard,
            model_name=spec.model_name,
        )

    @property
    def routers(self) -> list[Child]:
        """The router shards' processes (one, by default)."""
        return [shard.child for shard in self.shards]

    def _front(self) -> list[Child]:
        """The processes between the clients and the workers: the shards, and the frontend."""
        return [*self.routers, *([self.frontend] if self.frontend else [])]

    def _shard_view(self, child: Child) -> ShardView | None:
        return next((v for v in self.shards if v.child is child), None)

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
            self._start_prepare()
        else:
            self._start_all()

    def _start_all(self) -> None:
        if self.frontend:
            self.spawn(self.frontend)
        for child in self.routers:
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
        self.talk_to_router(now)
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
        view = self._shard_view(child)
        if view is not None:  # it is ready when *it* answers, not its predecessor
            view.status = None
            view.seq_floor = self.slots_sent
        where = f" on CPUs {format_cpulist(child.cpus)}" if child.cpus else ""
        nodes = f", node(s) {format_cpulist(child.nodes)}" if child.nodes else ""
        self._set(
            child, State.STARTING, f"spawn {child.name} pid {child.pid}{where}{nodes}", "spawn"
        )

    def terminate(self, child: Child, state: State = State.DRAINING) -> None:
        if child.pid is None:
            child.state = State.STOPPED
            return
        child.state = state
        child.term_sent_at = self.system.now()
        self._signal(child, signal.SIGTERM)

    def _signal(self, child: Child, sig: int) -> None:
        if child.pid is not None:
            child.killed = child.killed or sig == signal.SIGKILL
            self.system.kill(child.pid, sig)

    def all_children(self) -> list[Child]:
        current = [*self.routers, *self.workers.values(), *self.retired]
        if self.frontend:
            current.append(self.frontend)
        if self.prepare:
            current.append(self.prepare)
        if self.reload and self.reload.replacement:
            current.append(self.reload.replacement)
        return current

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
            self._abort_reload(f"the new {child.name} {child.last_exit} before it was ready")
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
        if expected or self.stopping:
            child.state = State.STOPPED
            return
        verdict = after_crash(child, code, self.system.now(), self.config.supervisor)
        if verdict.state == State.FATAL:
            self._set(child, State.FATAL, f"fatal: {child.name} {verdict.why}", "fatal")
        else:
            child.retry_at = self.system.now() + verdict.delay
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
        child.state = state
        if state == State.READY:
            child.ready_at = self.system.now()
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
                self._abort_reload(f"the changed model could not be prepared (exit {code})")
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
            self._start_all()

    # -- the router's view -------------------------------------------------------------------

    def talk_to_router(self, now: float) -> None:
        """Tell each shard our slot table; its answer says which workers it hears from."""
        for view in self.shards:
            for body in view.link.receive():
                if body.get("type") == protocol.STATUS and (body.get("seq") or 0) > view.seq_floor:
                    view.status = body["server"]
                    view.heard_at = now
                    view.acked = max(view.acked, body.get("seq") or 0)
        if now >= self.next_poll:
            self.send_slots()

    def send_slots(self) -> None:
        """Our slot table to every shard, for `numaserve status`: on a timer, and on every
        change of state, so that status never lags what systemd was told. Each shard also gets
        the others' latest status, so that any of them can answer for the whole server."""
        self.next_poll = self.system.now() + POLL_ROUTER_S
        self.slots_sent += 1
        table = {
            "type": protocol.SUPERVISOR,
            "seq": self.slots_sent,
            "pid": self.system.pid(),
            # so that `numaserve stop` signals this process and no other
            **self.system.identity(),
            "state": self.summary(),
            "slots": [c.describe() for c in self.workers.values()],
        }
        for view in self.shards:
            peers = [v.status for v in self.shards if v is not view and v.status]
            view.link.send({**table, "peers": peers} if len(self.shards) > 1 else table)

    def routed_pids(self, now: float) -> dict[int, set[int] | None]:
        """Per shard, the workers it hears from (None: no fresh word, judge nobody)."""
        return {v.child.shard: v.routed_pids(now, 4 * POLL_ROUTER_S) for v in self.shards}

    def snapshot(self, now: float) -> Snapshot:
        """The whole server as /metrics and the probes see it: the current processes (not
        those a reload retired, nor a replacement still starting under its slot's name)."""
        named = bool(self.config.models)
        kinds = [("router", c) for c in self.routers]
        kinds += [("frontend", self.frontend)] if self.frontend else []
        kinds += [("prepare", self.prepare)] if self.prepare else []
        kinds += [("worker", c) for c in self.workers.values()]
        return Snapshot(
            taken=now,
            stopping=self.stopping,
            build=tuple(
                {
                    "version": __version__,
                    "backend": m.backend,
                    "model": m.path,
                    "task": m.task,
                    "quantize": m.quantize,
                    **({"model_name": m.name} if named else {}),
                }
                for m in self.config.served
            ),
            pools=tuple((m.name, p.name) for m in self.config.served for p in m.pools),
            processes=tuple({**c.describe(), "kind": kind} for kind, c in kinds),
            shards=tuple(v.status for v in self.shards),
            shard_age=tuple(now - v.heard_at if v.status else None for v in self.shards),
            supervisor_pid=self.system.pid(),
        )

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        routed = self.routed_pids(now)
        for router in self.routers:
            if router.state == State.STARTING and routed[router.shard] is not None:
                message = f"ready {router.name}, clients on {self.config.server.endpoint}"
                self._set(router, State.READY, message, "ready")
        frontend = self.frontend
        answered = any(pids is not None for pids in routed.values())
        if frontend and frontend.state == State.STARTING and answered:
            # Up once a shard answers: the shards start after it, and it has no socket of
            # its own to the supervisor; a frontend that cannot listen exits first.
            message = f"ready frontend, clients on {self.config.server.endpoint}"
            self._set(frontend, State.READY, message, "ready")
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
            if (
                child.term_sent_at is not None
                and child.pid is not None
                and now - child.term_sent_at > self._kill_after(child)
            ):
                log.warning("%s did not stop in time: SIGKILL", child.name, extra={"event": "kill"})
                self._signal(child, signal.SIGKILL)
                child.term_sent_at = float("inf")  # once
            if child.state == State.BACKOFF and now >= child.retry_at and not self.stopping:
                child.restarts += 1
                log.info(
                    "restart %s (restart %d)",
                    child.name,
                    child.restarts,
                    extra={"event": "restart"},
                )
                self.spawn(child)
        self._check_viable()  # after any exit, and a spawn that failed
        if self.reload:
            self._advance_reload(now)
        if self.stopping:
            self._advance_stop()
        self._notify(now)

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
            self._signal(child, signal.SIGKILL)

    def _check_heard(self, child: Child, now: float, routed: set[int]) -> None:
        """A READY instance the router stops hearing (hung, or stopped) gets SIGTERM, then
        SIGKILL; its exit then restarts it."""
        if child.pid in routed:
            child.unrouted_since = None
        elif child.unrouted_since is None:
            child.unrouted_since = now
        elif now - child.unrouted_since > self._silence_limit() and child.term_sent_at is None:
            log.warning(
                "%s stopped heartbeating: SIGTERM, then SIGKILL",
                child.name,
                extra={"event": "hung"},
            )
            child.term_sent_at = now
            self._signal(child, signal.SIGTERM)

    def _silence_limit(self) -> float:
        server = self.config.server
        return 2 * server.heartbeat_ms * server.heartbeat_liveness / 1000 + 1

    def _kill_after(self, child: Child) -> float:
        s = self.config.supervisor
        draining = child in self.routers or bool(self.reload and child in self.reload.draining)
        return s.drain_timeout_s + s.kill_timeout_s if draining else s.kill_timeout_s

    # -- stopping ----------------------------------------------------------------------------

    def begin_stop(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.failure_code = 0
        if self.reload:
            self._abort_reload("stopping")
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
                router.state = State.STOPPED

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
                    child.state = State.STOPPED
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
            self._signal(child, signal.SIGKILL)

    # -- reloading ---------------------------------------------------------------------------

    def begin_reload(self) -> None:
        if self.stopping:
            return
        if self.reload or self.prepare:
            what = "reload" if self.reload else "preparing the model"
            log.info("%s already under way; SIGHUP ignored", what, extra={"event": "reload"})
            return
        try:
            config = load_config(self.config_path)
            by_model = bool(config.models and self.config.models)
            removed, added = model_changes(self.config, config) if by_model else ((), ())
            with self.ledger.locked() if self.ledger and by_model else nullcontext():
                plan = self._replan(config) if by_model else self._plan(config)
                shaped = self._keep_shards(config) if by_model else config
                new = self._deploy(shaped, plan, self.deployment.shard_numbers())
                if self.ledger and by_model and plan != self.plan:  # ours until the reload ends
                    both = {*held_cpus(self.plan, self.topo), *held_cpus(plan, self.topo)}
                    self.ledger.update(tuple(sorted(both)))
        except (ConfigError, PlacementError, OSError) as e:
            log.error("reload failed, keeping the running config: %s", e, extra={"event": "reload"})
            return
        changes = unapplied_changes(self.deployment, new, by_model)
        if by_model and config.server.routers != self.config.server.routers:
            changes.append("server.routers changed")
        weights = {m.name: m.weight for m in self.config.models}
        changes += [
            f"model {m.name!r}'s weight changed (instances stay where they are)"
            for m in config.models
            if m.name in weights and m.weight != weights[m.name]
        ]
        for change in changes:
            log.warning(
                "reload: %s; it applies at the next restart", change, extra={"event": "reload"}
            )
        # `model:`: every instance restarts (new weights at the same path load too). `models:`:
        # only the instances whose model's settings changed; the others keep serving.
        waiting = deque(
            w.name
            for w in new.workers
            if w.name in self.workers
            and self.workers[w.name].state == State.READY
            and (not by_model or self.workers[w.name].argv != w.argv())
        )
        kept = sorted(
            {w.model_name for w in new.workers if w.name in self.workers}
            - {self.workers[name].model_name for name in waiting}
        )
        log.info(
            "reload: %srestarting %d instance(s) one at a time%s",
            "".join(
                f"{what} model(s) {', '.join(names)}; "
                for what, names in (("removing", removed), ("adding", added))
                if names
            ),
            len(waiting),
            f"; unchanged, kept running: {', '.join(kept)}" if by_model and kept else "",
            extra={"event": "reload"},
        )
        self.notifier.reloading("reloading")
        self.reload = Reload(config, plan, new, waiting, by_model, removed, added)
        before = {m.name: m.model for m in self.config.served}
        if any(m.backend == "onnxruntime" and m.model != before.get(m.name) for m in config.served):
            self._start_prepare()

    def _plan(self, config: Config) -> Plan:
        return plan_placement(self.topo, config.placement, config.models)

    def _replan(self, config: Config) -> Plan:
        """A `models:` reload's plan: the kept models' instances where they are, the added
        ones on whole cores free of them and of other servers (the ledger, read again under
        its lock: they may have started since we did)."""
        holders = self.ledger.holders() if self.ledger else []
        return replan(self.plan, without(self.topo, holders), config.placement, config.models)

    def _keep_shards(self, config: Config) -> Config:
        """`config` with the running server.routers: the kept models keep their shards (a
        change applies at a restart)."""
        server = dataclasses.replace(config.server, routers=self.config.server.routers)
        return dataclasses.replace(config, server=server)

    def _advance_reload(self, now: float) -> None:
        r = self.reload
        if self.prepare is not None:
            return  # no process changes before the new models' artifacts are ready
        if r.by_model and not (r.reshaped or self._reshape(r)):
            return
        if any(w.state == State.STARTING for w in self.workers.values() if w.model_name in r.added):
            return  # the changed models roll once the added ones are up
        if r.replacement is None:
            if not r.waiting:
                if not self._shards_show_final_table(r):
                    return
                self.config = r.config
                self.reload = None
                log.info("reload: done", extra={"event": "reload"})
                self.announced_ready = False  # READY=1 again for systemd
                return
            name = r.waiting.popleft()
            r.replacement = self._worker_child(r.spec(name))
            r.replacement.restarts = self.workers[name].restarts
            self.spawn(r.replacement)
        elif r.replacement.state == State.READY:
            old = self.workers[r.replacement.name]
            self.workers[old.name] = r.replacement
            r.replacement = None
            self.retired.append(old)
            self.terminate(old)
        elif (
            r.replacement.state == State.STARTING
            and now - r.replacement.started_at > self.config.supervisor.start_timeout_s
        ):
            self._abort_reload(f"the new {r.replacement.name} was not ready in time")

    def _shards_show_final_table(self, r: Reload) -> bool:
        """Whether every serving shard has answered the slot table of the reload's end, so
        that `numaserve status` asked after `reload: done` shows the new instances."""
        if r.final_table is None:
            self.send_slots()
            r.final_table = self.slots_sent
        serving = [v for v in self.shards if v.child.state == State.READY]
        return all(v.acked >= r.final_table for v in serving)

    def _reshape(self, r: Reload) -> bool:
        """Removed models out, then added models in; True once done. The removed models'
        shards drain first (their instances finish what they hold), then their instances
        stop; only then do the frontend's routes change and the added models start, on cores
        the removed ones may have held."""
        if r.removed and not (r.draining or r.stopping):
            gone = [v for v in self.shards if v.child.model_name in r.removed]
            self.shards = [v for v in self.shards if v not in gone]
            for view in gone:
                view.link.close()
                r.draining.append(view.child)
                self.terminate(view.child)
            r.stopping = [w for w in self.workers.values() if w.model_name in r.removed]
            for child in r.stopping:
                del self.workers[child.name]
            self.retired += [*r.draining, *r.stopping]
        if any(c.pid is not None for c in r.draining):
            return False
        for child in r.stopping:
            if child.pid is not None and child.term_sent_at is None:
                self.terminate(child)
        if any(c.pid is not None for c in r.stopping):
            return False
        self._take_up(r)
        r.reshaped = True
        return True

    def _take_up(self, r: Reload) -> None:
        """The new shape: the frontend's routes, the added models' shards and instances, and
        our ledger entry."""
        new, running = r.deployment, self.deployment
        frontend = running.frontend
        if self.frontend and frontend and new.frontend and new.frontend.routes != frontend.routes:
            frontend = dataclasses.replace(frontend, routes=new.frontend.routes)
            with open(frontend.routes_file, "w") as f:
                f.write(frontend.to_json())
            self.frontend.argv = frontend.argv()  # a restart starts with them too
            self._signal(self.frontend, signal.SIGHUP)
        for spec in new.routers:
            if spec.model_name in r.added:
                self.shards.append(self._shard(spec))
                self.spawn(self.shards[-1].child)
        for spec in new.workers:
            if spec.model_name in r.added:
                self.workers[spec.name] = self._worker_child(spec)
                self.spawn(self.workers[spec.name])
        if r.plan != self.plan:
            self._hold(r.plan)
        # What runs now: the kept shards as they were started (their settings apply at a
        # restart), the added ones, and the new instances' specs.
        routers = [s for s in running.routers if s.model_name not in r.removed]
        routers += [s for s in new.routers if s.model_name in r.added]
        routers.sort(key=lambda spec: spec.shard)
        self.plan, self.config = r.plan, r.config  # a retry compares with what runs now
        self.deployment = Deployment(tuple(routers), frontend, new.workers)

    def _hold(self, plan: Plan) -> None:
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

    def _abort_reload(self, why: str) -> None:
        r, self.reload = self.reload, None
        if r and r.by_model and not r.reshaped and r.plan != self.plan:
            self._hold(self.plan)  # the cores it would have added are not ours
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

    # -- systemd -----------------------------------------------------------------------------

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for child in self.workers.values():
            counts[child.state.value] = counts.get(child.state.value, 0) + 1
        parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        prefix = (
            "stopping: "
            if self.stopping
            else "reloading: "
            if self.reload
            else "preparing the model: "
            if self.prepare
            else ""
        )
        routers = ", ".join(r.state.value for r in self.routers)
        return f"{prefix}{parts}; router{'s' if len(self.shards) > 1 else ''} {routers}"

    def _notify(self, now: float) -> None:
        workers = list(self.workers.values())
        serving = all(c.state == State.READY for c in self._front()) and any(
            w.state == State.READY for w in workers
        )
        settled = all(w.state in (State.READY, State.FATAL) for w in workers)
        status = self.summary()
        # Every shard must have our latest slot table before systemd hears READY=1, so
        # that `numaserve status` asked right after it shows what systemd was told.
        router_current = all(v.acked == self.slots_sent for v in self.shards)
        if (
            serving
            and settled
            and router_current
            and not self.announced_ready
            and not self.stopping
            and not self.reload
        ):
            self.announced_ready = True
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

    def close(self) -> None:
        for view in self.shards:
            view.link.close()
        self.notifier.close()


def start(config_path: str) -> int:
    """`numaserve start`: plan, supervise, return the exit code. Raises ConfigError,
    PlacementError, CurveError or MonitoringError for a config that cannot run here (before
    anything starts)."""
    config = load_config(config_path)
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
            config_path, config, topo, runtime_dir, system=system, monitor=monitor, ledger=ledger
        )
        return supervisor.run()


def _remove(runtime_dir: Path) -> None:
    for path in runtime_dir.glob("*"):
        path.unlink(missing_ok=True)
    runtime_dir.rmdir()
