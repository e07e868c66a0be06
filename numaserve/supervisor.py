"""The supervisor: runs a Plan as processes and keeps them running.

After gunicorn's arbiter: signal handlers only enqueue, and the main loop dispatches to
`handle_<signal>`; children are reaped with waitpid(-1, WNOHANG) in a loop. After supervisord:
each slot has an explicit state (STARTING -> READY -> DRAINING -> STOPPED, plus BACKOFF and
FATAL), and one that keeps dying before it is ready goes FATAL instead of looping. After circus:
a restarted worker keeps its slot, so it comes back on the same CPUs and node.

The router tells the supervisor which workers it hears from, over the router's private worker
socket; the supervisor tells the router its slot table, which `numaserve status` shows.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import zmq

from numaserve import exitcodes, procinfo, protocol
from numaserve.config import Config, ConfigError, load_config
from numaserve.cpulist import format_cpulist
from numaserve.deployment import Deployment, deployment
from numaserve.lifecycle import PARENT_ENV
from numaserve.logs import FORMAT_ENV, LEVEL_ENV
from numaserve.placement import PlacementError, plan_placement
from numaserve.sdnotify import Notifier
from numaserve.topology import CPUTopology, read_topology
from numaserve.worker import command as worker_command

log = logging.getLogger("numaserve.supervisor")
POLL_ROUTER_S = 0.25
FAST_STOP_EXIT = 128 + signal.SIGINT
SYSTEMD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


class State(str, Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    BACKOFF = "backoff"
    FATAL = "fatal"


@dataclass(eq=False)
class Child:
    """One supervised process: the router, or one slot's worker."""

    name: str
    argv: list[str]
    pool: str | None = None
    cpus: tuple[int, ...] = ()
    nodes: tuple[int, ...] = ()
    state: State = State.STOPPED
    pid: int | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    unrouted_since: float | None = None  # READY, alive, but the router no longer hears it
    term_sent_at: float | None = None
    killed: bool = False  # numaserve sent it SIGKILL
    retry_at: float = 0.0
    restarts: int = 0
    quick_exits: int = 0
    exit_code: int | None = None
    last_exit: str = ""

    def describe(self) -> dict:
        return {
            "name": self.name,
            "pool": self.pool,
            "state": self.state.value,
            "pid": self.pid,
            "cpus": list(self.cpus),
            "nodes": list(self.nodes),
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }


@dataclass
class Reload:
    """A rolling restart in progress: one slot at a time."""

    config: Config
    deployment: Deployment
    waiting: deque[str]
    replacement: Child | None = None
    preparing: int | None = None  # pid of `numaserve prepare` for a changed model
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(self, config_path: str, config: Config, topo: CPUTopology):
        self.config_path, self.config, self.topo = config_path, config, topo
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="numaserve-"))
        self.deployment = self._deploy(config)
        self.router = Child(
            "router", self._router_argv(self.deployment), cpus=self.deployment.router.cpus
        )
        self.workers = {spec.name: self._worker_child(spec) for spec in self.deployment.workers}
        self.retired: list[Child] = []  # replaced during a reload, still finishing
        self.signals: deque[int] = deque()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.notifier = Notifier()
        self.ctx = zmq.Context()
        self.control = self._control_socket()
        self.router_status: dict | None = None
        self.router_heard_at = 0.0
        self.next_poll = 0.0
        self.slots_sent = 0  # sequence number of the latest slot table sent to the router
        self.slots_acked = 0  # ... and of the latest one the router has answered
        self.router_seq_floor = 0  # answers to tables sent before the router's start are stale
        self.next_watchdog = 0.0
        self.stopping = False  # a graceful stop is under way
        self.fast = False
        self.exit_code: int | None = None
        self.reload: Reload | None = None
        self.announced_ready = False
        self.last_status = ""
        self.failure_code = 0
        self.identity = procinfo.identity()
        self.config_env = {LEVEL_ENV: config.logging.level, FORMAT_ENV: config.logging.format}

    # -- building ----------------------------------------------------------------------------

    def _deploy(self, config: Config) -> Deployment:
        return deployment(
            config, plan_placement(self.topo, config.placement), self.topo, self.runtime_dir
        )

    @staticmethod
    def _router_argv(d: Deployment) -> list[str]:
        return [sys.executable, "-m", "numaserve.router", "--spec", d.router.to_json()]

    @staticmethod
    def _worker_child(spec) -> Child:
        return Child(spec.name, worker_command(spec), spec.pool, spec.cpus, spec.nodes)

    def _control_socket(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(self.deployment.router.workers_endpoint)
        return sock

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._enqueue)
        log.info(
            "starting: %d instance(s), router on %s, config %s",
            len(self.workers),
            self.config.server.endpoint,
            self.config_path,
            extra={"event": "start"},
        )
        self.spawn(self.router)
        for child in self.workers.values():
            self.spawn(child)
        while self.exit_code is None:
            select.select([self.wake_r], [], [], 0.1)
            self._drain_wake_pipe()
            while self.signals:
                name = signal.Signals(self.signals.popleft()).name.lower()
                getattr(self, f"handle_{name}")()
            self.reap_children()
            now = time.monotonic()
            self.talk_to_router(now)
            self.tick(now)
        self.cleanup()
        return self.exit_code

    def _enqueue(self, signum, frame) -> None:
        self.signals.append(signum)
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_w, b"s")

    def _drain_wake_pipe(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 4096):
                pass

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
        pass  # the loop reaps after every wake-up

    # -- processes ---------------------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        """Our environment less systemd's variables (NotifyAccess=main), plus the logging
        settings from the config."""
        return {k: v for k, v in os.environ.items() if k not in SYSTEMD_VARS} | self.config_env

    def spawn(self, child: Child) -> None:
        env = self._child_env() | {PARENT_ENV: str(os.getpid())}
        try:
            # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which
            # then stops the children in order (router drains first).
            child.pid = os.posix_spawn(child.argv[0], child.argv, env, setsid=True)
        except OSError as e:
            self._set(child, State.FATAL, f"fatal: {child.name} cannot be started: {e}", "fatal")
            return
        child.started_at = time.monotonic()
        child.term_sent_at = child.unrouted_since = child.ready_at = None
        child.killed = False
        if child is self.router:  # it is ready when *it* answers, not its predecessor
            self.router_status = None
            self.router_seq_floor = self.slots_sent
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
        child.term_sent_at = time.monotonic()
        self._signal(child, signal.SIGTERM)

    def _signal(self, child: Child, sig: int) -> None:
        if child.pid is not None:
            child.killed = child.killed or sig == signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, sig)

    def all_children(self) -> list[Child]:
        current = [self.router, *self.workers.values(), *self.retired]
        if self.reload and self.reload.replacement:
            current.append(self.reload.replacement)
        return current

    def reap_children(self) -> None:
        """waitpid(-1, WNOHANG) until nothing is left to reap; ECHILD means no children."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                return
            child = next((c for c in self.all_children() if c.pid == pid), None)
            if child is not None:
                self.on_exit(child, status)
            elif self.reload and pid == self.reload.preparing:
                self._prepared(os.waitstatus_to_exitcode(status))

    def on_exit(self, child: Child, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        child.pid = None
        child.exit_code = code
        if code < 0:
            child.last_exit = f"killed by {exitcodes.signal_name(-code)}"
            if -code == signal.SIGKILL and not child.killed:
                child.last_exit += (
                    " (not by numaserve: possibly the out-of-memory killer, see dmesg, "
                    "or another process)"
                )
        else:
            child.last_exit = f"exit {code} ({exitcodes.DESCRIPTION.get(code, 'error')})"
        expected = child.state in (State.DRAINING, State.STOPPED) or self.fast
        if child in self.retired:
            self.retired.remove(child)
            log.info("exit %s (replaced): %s", child.name, child.last_exit, extra={"event": "exit"})
            return
        if self.reload and child is self.reload.replacement:
            self._abort_reload(f"the new {child.name} {child.last_exit} before it was ready")
            return
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
        if code in exitcodes.NEVER_RESTART:
            self._set(
                child,
                State.FATAL,
                f"fatal: {child.name} {exitcodes.DESCRIPTION[code]}; not restarting it (see its log lines above)",
                "fatal",
            )
        else:
            stable = self.config.supervisor.stable_s
            was_up = child.ready_at is not None and time.monotonic() - child.ready_at >= stable
            child.quick_exits = 0 if was_up else child.quick_exits + 1
            limit = self.config.supervisor.max_quick_exits
            if child.quick_exits >= limit:
                self._set(
                    child,
                    State.FATAL,
                    f"fatal: {child.name} exited {limit} times in a row before it had been "
                    f"ready for {stable:g} s (supervisor.stable_s); not restarting it",
                    "fatal",
                )
            else:
                delay = self._backoff(child)
                child.retry_at = time.monotonic() + delay
                self._set(
                    child,
                    State.BACKOFF,
                    f"backoff {child.name}: restarting in {delay:.1f} s",
                    "backoff",
                )
        self._check_viable()

    def _backoff(self, child: Child) -> float:
        s = self.config.supervisor
        return min(s.backoff_max_s, s.backoff_initial_s * 2 ** max(0, child.quick_exits - 1))

    def _check_viable(self) -> None:
        """With the router or every worker FATAL, nothing can be served: stop, and say so."""
        workers = list(self.workers.values())
        if self.router.state == State.FATAL or all(w.state == State.FATAL for w in workers):
            codes = {c.exit_code for c in [self.router, *workers] if c.state == State.FATAL}
            code = codes.pop() if len(codes) == 1 and codes <= exitcodes.NEVER_RESTART else 1
            log.error(
                "fatal: no instance can serve; stopping (exit %d)", code, extra={"event": "fatal"}
            )
            self.begin_stop("no instance can serve")
            self.failure_code = code

    def _set(self, child: Child, state: State, message: str, event: str) -> None:
        child.state = state
        if state == State.READY:
            child.ready_at = time.monotonic()
        self.send_slots()
        level = logging.ERROR if state == State.FATAL else logging.INFO
        log.log(level, "%s", message, extra={"event": event, "instance": child.name})

    # -- the router's view -------------------------------------------------------------------

    def talk_to_router(self, now: float) -> None:
        """Tell the router our slot table; its answer says which workers it hears from."""
        while self.control.poll(0):
            try:
                body = protocol.unpack(self.control.recv_multipart())
            except protocol.ProtocolError:
                continue
            if (
                body.get("type") == protocol.STATUS
                and (body.get("seq") or 0) > self.router_seq_floor
            ):
                self.router_status = body["server"]
                self.router_heard_at = now
                self.slots_acked = max(self.slots_acked, body.get("seq") or 0)
        if now >= self.next_poll:
            self.send_slots()

    def send_slots(self) -> None:
        """Our slot table to the router, for `numaserve status`: on a timer, and on every
        change of state, so that status never lags what systemd was told."""
        self.next_poll = time.monotonic() + POLL_ROUTER_S
        self.slots_sent += 1
        slots = [c.describe() for c in self.workers.values()]
        message = {
            "type": protocol.SUPERVISOR,
            "seq": self.slots_sent,
            "pid": os.getpid(),
            **self.identity,  # so that `numaserve stop` signals this process and no other
            "state": self.summary(),
            "slots": slots,
        }
        with contextlib.suppress(zmq.Again):
            self.control.send_multipart(protocol.pack(message), zmq.NOBLOCK)

    def routed_pids(self, now: float) -> set[int] | None:
        if self.router_status is None or now - self.router_heard_at > 4 * POLL_ROUTER_S:
            return None  # no fresh word from the router: judge nobody
        return set(self.router_status.get("routed_pids", ()))

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        routed = self.routed_pids(now)
        s = self.config.supervisor
        if self.router.state == State.STARTING and routed is not None:
            self._set(
                self.router,
                State.READY,
                f"ready router, clients on {self.config.server.endpoint}",
                "ready",
            )
        for child in [
            *self.workers.values(),
            *([self.reload.replacement] if self.reload and self.reload.replacement else []),
        ]:
            if child.state == State.STARTING:
                if routed is not None and child.pid in routed:
                    self._set(
                        child,
                        State.READY,
                        f"ready {child.name} pid {child.pid} in {now - child.started_at:.1f} s",
                        "ready",
                    )
                elif now - child.started_at > s.start_timeout_s and child.term_sent_at is None:
                    log.warning(
                        "%s not ready after %.0f s: killing it",
                        child.name,
                        s.start_timeout_s,
                        extra={"event": "timeout"},
                    )
                    child.term_sent_at = now
                    self._signal(child, signal.SIGKILL)
            elif child.state == State.READY and routed is not None and not self.stopping:
                if child.pid in routed:
                    child.unrouted_since = None
                elif child.unrouted_since is None:
                    child.unrouted_since = now
                elif (
                    now - child.unrouted_since > self._silence_limit()
                    and child.term_sent_at is None
                ):
                    log.warning(
                        "%s stopped heartbeating: SIGTERM, then SIGKILL",
                        child.name,
                        extra={"event": "hung"},
                    )
                    child.term_sent_at = now
                    self._signal(child, signal.SIGTERM)
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
        if self.reload:
            self._advance_reload(now)
        if self.stopping:
            self._advance_stop()
        self._notify(now)

    def _silence_limit(self) -> float:
        server = self.config.server
        return 2 * server.heartbeat_ms * server.heartbeat_liveness / 1000 + 1

    def _kill_after(self, child: Child) -> float:
        s = self.config.supervisor
        return s.drain_timeout_s + s.kill_timeout_s if child is self.router else s.kill_timeout_s

    # -- stopping ----------------------------------------------------------------------------

    def begin_stop(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.failure_code = 0
        if self.reload:
            self._abort_reload("stopping")
        log.info(
            "drain: %s: the router finishes requests in flight (%.0f s at most), then the workers stop",
            why,
            self.config.supervisor.drain_timeout_s,
            extra={"event": "drain"},
        )
        self.notifier.stopping("draining")
        if self.router.pid is not None:
            self.terminate(self.router)
        else:
            self.router.state = State.STOPPED

    def _advance_stop(self) -> None:
        if self.router.pid is not None:
            return  # still draining
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
        if self.reload:
            log.info("reload already under way; SIGHUP ignored", extra={"event": "reload"})
            return
        try:
            config = load_config(self.config_path)
            new = self._deploy(config)
        except (ConfigError, PlacementError) as e:
            log.error("reload failed, keeping the running config: %s", e, extra={"event": "reload"})
            return
        if new.router.to_json() != self.deployment.router.to_json():
            log.warning(
                "reload: router and server settings changed; they apply at the next restart",
                extra={"event": "reload"},
            )
        names = [w.name for w in new.workers]
        if set(names) != set(self.workers):
            log.warning(
                "reload: the placement changed; it applies at the next restart",
                extra={"event": "reload"},
            )
        waiting = deque(
            n for n in names if n in self.workers and self.workers[n].state == State.READY
        )
        log.info(
            "reload: restarting %d instance(s) one at a time",
            len(waiting),
            extra={"event": "reload"},
        )
        self.notifier.reloading("reloading")
        self.reload = Reload(config, new, waiting)
        if config.model != self.config.model and config.model.backend == "onnxruntime":
            self._prepare_for_reload()

    def _prepare_for_reload(self) -> None:
        """A changed model's artifact is built before the first new instance starts, so that
        the build never runs inside an instance's start timeout: by `numaserve prepare`, in a
        process of its own, while the running instances keep serving."""
        argv = [sys.executable, "-m", "numaserve.cli", "prepare", "--config", self.config_path]
        try:
            self.reload.preparing = os.posix_spawn(argv[0], argv, self._child_env())
        except OSError as e:
            self._abort_reload(f"cannot run numaserve prepare: {e}")
            return
        log.info(
            "reload: preparing the changed model's ONNX artifact (pid %d) before restarting "
            "any instance",
            self.reload.preparing,
            extra={"event": "reload"},
        )

    def _prepared(self, code: int) -> None:
        self.reload.preparing = None
        if code != 0:
            self._abort_reload(f"the changed model could not be prepared (exit {code})")
        else:
            log.info("reload: the changed model's artifact is ready", extra={"event": "reload"})

    def _advance_reload(self, now: float) -> None:
        r = self.reload
        if r.preparing is not None:
            return  # no instance restarts before the changed model's artifact is ready
        if r.replacement is None:
            if not r.waiting:
                self.config = r.config
                self.reload = None
                log.info("reload: done", extra={"event": "reload"})
                self.announced_ready = False  # READY=1 again for systemd
                return
            name = r.waiting.popleft()
            spec = next(w for w in r.deployment.workers if w.name == name)
            r.replacement = self._worker_child(spec)
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

    def _abort_reload(self, why: str) -> None:
        r, self.reload = self.reload, None
        if r and r.preparing is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(r.preparing, signal.SIGTERM)  # reaped by reap_children, unmatched
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
        prefix = "stopping: " if self.stopping else "reloading: " if self.reload else ""
        return f"{prefix}{parts}; router {self.router.state.value}"

    def _notify(self, now: float) -> None:
        workers = list(self.workers.values())
        serving = self.router.state == State.READY and any(w.state == State.READY for w in workers)
        settled = all(w.state in (State.READY, State.FATAL) for w in workers)
        status = self.summary()
        # The router must have our latest slot table before systemd hears READY=1, so
        # that `numaserve status` asked right after it shows what systemd was told.
        router_current = self.slots_acked == self.slots_sent
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

    def cleanup(self) -> None:
        self.control.close(linger=0)
        self.ctx.term()
        self.notifier.close()
        for path in self.runtime_dir.glob("*"):
            path.unlink(missing_ok=True)
        self.runtime_dir.rmdir()


def start(config_path: str) -> int:
    """`numaserve start`: plan, supervise, return the exit code. Raises ConfigError or
    PlacementError for a config that cannot run here."""
    config = load_config(config_path)
    topo = read_topology()
    plan_placement(topo, config.placement)  # fail here, with the CLI's clear message
    if not prepare_model(config, topo.isa):
        return exitcodes.MODEL
    return Supervisor(config_path, config, topo).run()


def prepare_model(config: Config, isa: tuple[str, ...]) -> bool:
    """Build or verify the model's artifact once, before any instance starts: a first build
    (minutes for a large model on a slow CPU) then runs outside the instances' start timeout,
    and never once per instance. False (logged) when the model cannot be prepared."""
    if config.model.backend != "onnxruntime":
        return True
    from numaserve.modelpath import ModelLoadError
    from numaserve.onnx_model import prepare_artifact

    started = time.monotonic()
    log.info(
        "preparing the ONNX artifact of %s (built once and kept; a first build takes a while)",
        config.model.path,
        extra={"event": "prepare"},
    )
    try:
        artifact, _ = prepare_artifact(config.model, isa)
    except ModelLoadError as e:
        log.error("fatal: %s", e, extra={"event": "fatal"})
        return False
    log.info(
        "ONNX artifact ready in %.1f s: %s",
        time.monotonic() - started,
        artifact,
        extra={"event": "prepare"},
    )
    return True
