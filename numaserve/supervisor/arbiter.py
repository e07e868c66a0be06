"""The supervisor's loop: runs a Plan as processes and keeps them running.

After gunicorn's arbiter: signal handlers only enqueue (processes.py), and the loop dispatches
to `handle_<signal>`; exited children are reaped in a loop. Each slot moves through the states
of children.py (`Child.change_state`, guarded), on events (spawned, heard by the router,
exited, a signal) and the clock; the server as a whole is in one phase (phase.py: preparing,
starting, serving, reloading, stopping), changed only along its table by `enter`.

The arbiter alone holds and writes the server's state (which children run, the phase, the
config and plan that run). The other modules decide and return
actions: each child of its own timers (children.py), liveness who is ready or silent,
rollout.next_steps the next step to a wanted deployment (the start's, a reload's) from what
runs, a Stop what to stop next; `carry_out` here is the one place they take effect. No
function outside this module takes the Supervisor (tests/test_supervisor_ownership.py).

All of its effects go through a System (processes, signals, files, the clock), a RouterLink
per router shard and a Notifier, so that the tests drive the whole state machine with fakes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from numaserve.config.ports import AS_WRITTEN, Ports
from numaserve.config.runtimes import needs_prepare
from numaserve.config.schema import Config
from numaserve.host.ledger import Ledger, held_cpus
from numaserve.host.placement import Plan
from numaserve.host.topology import CPUTopology
from numaserve.monitoring.endpoint import MonitoringEndpoint
from numaserve.processes import exitcodes
from numaserve.processes.lifecycle import PARENT_ENV
from numaserve.processes.logs import FORMAT_ENV, LEVEL_ENV
from numaserve.processes.specs import Deployment, FrontSpec
from numaserve.processes.tracing import described as tracing_described
from numaserve.processes.tracing import environment as tracing_environment
from numaserve.status.merge import server_report
from numaserve.status.report import Front, SlotTable, SupervisorInfo
from numaserve.supervisor import liveness, reporting, rollout
from numaserve.supervisor.children import (
    Announce,
    Child,
    Signal,
    Spawn,
    State,
    Terminate,
    describe_exit,
)
from numaserve.supervisor.control import ControlSocket, Request
from numaserve.supervisor.phase import (
    Created,
    Ended,
    Phase,
    PhaseError,
    Preparing,
    Reloading,
    Serving,
    Starting,
    Stopping,
    check_next,
    expect,
)
from numaserve.supervisor.processes import System
from numaserve.supervisor.reload import (
    Site,
    needs_new_artifacts,
    plan_reload,
    renewing,
    with_records,
)
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.rollout import (
    Abort,
    Action,
    Adopt,
    Hold,
    Leave,
    Renew,
    Renewed,
    RenewFronts,
    Replace,
    Reroute,
    Reshaped,
    Running,
    Shape,
    Started,
    Wanted,
)
from numaserve.supervisor.roster import Roster
from numaserve.supervisor.router_link import RouterLink, ShardLinks, ShardQuestion
from numaserve.supervisor.sdnotify import Notifier
from numaserve.supervisor.stop import Stop
from numaserve.wire import protocol

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
        control: ControlSocket | None = None,
        environ: Mapping[str, str] = os.environ,
        ledger: Ledger | None = None,
        ports: Ports = AS_WRITTEN,
    ):
        """`plan`: placed by the caller, once (start(): around other servers' cores).
        `ports`: what the command line moved, over the file, at every reload too.
        `monitor`: where each turn's Snapshot goes (server.metrics); none when it is off.
        `ledger`: the host's core ledger, where our entry is (updated when a reload adds
        models). `control`: where `numaserve status` and `stop` ask us (None: no ledger
        entry names one)."""
        self.site = Site(config_path, topo, runtime_dir, ports, ledger)
        self.shape = Shape(config, plan, self.site.deploy(config, plan))  # replaced whole
        self.system = system
        self.connect = connect
        self.notifier = notifier or Notifier()
        self.announcer = reporting.Announcer(self.notifier)
        self.monitor = monitor
        self.control = control
        # Status questions, from the control socket or passed on by a shard: (asker, the table
        # whose answers it waits for, deadline).
        self.asked_status: list[tuple[Request | ShardQuestion, int, float]] = []
        self.roster = Roster([])
        self.shards = ShardLinks(self.roster, connect, POLL_ROUTER_S)  # the roster's shards
        for spec in self.deployment.routers:
            self.roster.join(Child.for_shard(spec))
        self.shards.sync()  # the shards' links, made now
        frontend = self.deployment.frontend
        for child in [
            *([Child.for_frontend(frontend)] if frontend else []),
            *(Child.for_front(spec) for spec in self.deployment.fronts),
            *(Child.for_worker(spec) for spec in self.deployment.workers),
        ]:
            self.roster.join(child)
        self.phase: Phase = Created()  # changed by `enter` alone
        self.announced: tuple = ()  # the children's states the shards last heard
        # Our environment less systemd's variables (NotifyAccess=main), plus the config's
        # logging settings (the children log as the supervisor does) and its tracing's.
        self.child_env = {k: v for k, v in environ.items() if k not in SYSTEMD_VARS} | {
            LEVEL_ENV: config.logging.level,
            FORMAT_ENV: config.logging.format,
            **tracing_environment(config.server.tracing),
        }

    @property
    def topo(self) -> CPUTopology:
        return self.site.topo

    # -- the phase, and what it holds ----------------------------------------------------------

    def enter(self, phase: Phase) -> None:
        """The one way the server's phase changes (phase.NEXT). systemd hears RELOADING=1 and
        STOPPING=1 as those phases begin; READY=1 with the status line, on the turn the server
        begins serving (`_notify`)."""
        old, self.phase = self.phase, check_next(self.phase, phase)
        if type(phase) is type(old):
            return
        if isinstance(phase, Reloading):
            self.notifier.reloading("reloading")
        elif isinstance(phase, Stopping):
            self.notifier.stopping("draining")

    @property
    def mood(self) -> Mood:
        return self.phase.mood

    @property
    def stopping(self) -> bool:
        return isinstance(self.phase, (Stopping, Ended))

    @property
    def reloading(self) -> bool:
        return isinstance(self.phase, Reloading)

    @property
    def wanted(self) -> Wanted | None:
        """The deployment a start or a reload brings what runs to, while one is under way."""
        if isinstance(self.phase, (Preparing, Starting, Reloading)):
            return self.phase.wanted
        return None

    @property
    def prepare(self) -> Child | None:
        """`numaserve prepare`, while it runs for the start or a reload."""
        if isinstance(self.phase, (Preparing, Reloading)):
            return self.phase.prepare
        return None

    @property
    def replacement(self) -> Child | None:
        """A reload's new instance of a slot, starting."""
        return self.phase.replacement if isinstance(self.phase, Reloading) else None

    @property
    def stop(self) -> Stop | None:
        return self.phase.stop if isinstance(self.phase, Stopping) else None

    @property
    def exit_code(self) -> int | None:
        return self.phase.exit_code if isinstance(self.phase, Ended) else None

    @property
    def config(self) -> Config:
        return self.shape.config

    @property
    def plan(self) -> Plan:
        return self.shape.plan

    @property
    def deployment(self) -> Deployment:
        return self.shape.deployment

    def all_children(self) -> list[Child]:
        """Every child: the roster's, and the phase's own (a prepare, a replacement)."""
        return self.roster.every(self.prepare, self.replacement)

    def running(self) -> Running:
        return Running(
            self.config,
            self.plan,
            self.deployment,
            self.roster,
            preparing=self.prepare is not None,
            replacement=self.replacement,
            generation=self.shape.generation,
        )

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        self.system.catch(CAUGHT)
        self.begin()
        while self.exit_code is None:
            links = [view.link.sock for view in self.shards]
            self.step(self.system.wait(0.1, links + (self.control.fds() if self.control else [])))
        self.close()
        return self.exit_code

    def begin(self) -> None:
        """Prepare the model, if it needs it; then start the router and every worker."""
        log.info(
            "starting: %d instance(s), %d router shard(s) on %s, config %s",
            len(self.roster.workers),
            len(self.shards),
            self.config.server.endpoint,
            self.site.config_path,
            extra={"event": "start"},
        )
        log.info("%s", tracing_described(self.child_env), extra={"event": "start"})
        wanted = Wanted.start(self.config, self.plan, self.deployment)
        if any(needs_prepare(m.backend, m.quantize) for m in self.config.models):
            prepare = self.prepare_child()
            self.enter(Preparing(wanted, prepare))
            self.spawn(prepare)
        else:
            self.enter(Starting(wanted))
            self.roll_out(self.system.now())

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
        for question in self.shards.receive(now):
            self.ask_status(question, now)
        if self.control is not None:
            self.answer_control(now)
        self.answer_status(now)
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
            fast, kills = self.stop.kill(self.all_children())
            self.enter(Stopping(fast))
            self.carry_out(kills)
        else:
            self.begin_stop("SIGINT (again for a fast stop)")

    def handle_sighup(self) -> None:
        for front in self.roster.fronts:  # they read the API keys file again at once
            self.signal(front, signal.SIGHUP)
        self.begin_reload()

    def handle_sigchld(self) -> None:
        pass  # every turn of the loop reaps

    # -- processes ---------------------------------------------------------------------------

    def spawn(self, child: Child) -> None:
        env = self.child_env | {PARENT_ENV: str(self.system.pid())}
        try:
            # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which
            # then stops the children in order (router drains first).
            pid = self.system.spawn(child.argv, env, new_session=True)
        except OSError as e:
            self.set_state(
                child, State.FATAL, f"fatal: {child.name} cannot be started: {e}", "fatal"
            )
            if child is self.prepare:
                self._prepared(exitcodes.MODEL)
            return
        child.spawned(pid, self.system.now())
        view = self.shards.of(child)
        if view is not None:
            self.shards.restarted(view)
        where = f" on {child.binding}" if child.binding else ""
        self.set_state(child, State.STARTING, f"spawn {child.name} pid {child.pid}{where}", "spawn")

    def terminate(self, child: Child, state: State = State.DRAINING) -> None:
        child.terminating(state, self.system.now())
        self.signal(child, signal.SIGTERM)

    def signal(self, child: Child, sig: int) -> None:
        if child.pid is not None:
            child.signalled(sig)
            self.system.kill(child.pid, sig)

    def on_exit(self, child: Child, code: int) -> None:
        """`code` is negative for a signal."""
        child.exited(code)
        if child is self.prepare:
            self._prepared(code)
            return
        if self.roster.reaped(child):
            log.info("exit %s (retired): %s", child.name, child.last_exit, extra={"event": "exit"})
            return
        if child is self.replacement:
            self.abort_reload(f"the new {child.name} {child.last_exit} before it was ready")
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
        self.carry_out([child.crashed(code, now, self.config.supervisor)])

    def set_state(self, child: Child, state: State, message: str, event: str) -> None:
        """A state change the shards and the log hear of at once (any other change of a
        child's state, the shards hear of at the end of its turn: `announce`)."""
        child.change_state(state, self.system.now())
        self.send_slots()
        level = logging.ERROR if state == State.FATAL else logging.INFO
        log.log(level, "%s", message, extra={"event": event, "instance": child.name})

    # -- preparing the model -----------------------------------------------------------------

    def prepare_child(self) -> Child:
        """`numaserve prepare`, to resolve each model once before any instance starts (each
        pool's path and artifact, written where the instances' specs name it): in a process
        of its own, which leaves the supervisor small (the build imports torch) and, during a
        reload, the running instances serving; so no build runs in a start timeout."""
        argv = [
            *PREPARE,
            "--config",
            self.site.config_path,
            "--record-dir",
            str(self.site.runtime_dir),
        ]
        return Child("prepare", argv)

    def _prepared(self, code: int) -> None:
        """`numaserve prepare` exited with `code`: the start goes on, or the server cannot
        start; a reload goes on, or is aborted."""
        phase = self.phase
        if isinstance(phase, Reloading) and code != 0:
            self.enter(dataclasses.replace(phase, prepare=None))
            self.abort_reload(f"the changed model could not be prepared (exit {code})")
        elif isinstance(phase, Reloading):
            log.info("reload: the changed model's artifact is ready", extra={"event": "reload"})
            wanted = self.with_records(phase.wanted)
            # What prepare resolved may have changed for a kept model's pool too: renewed.
            renew = renewing(wanted.config, wanted.deployment, self.roster.workers)
            if more := [name for name in renew if name not in wanted.renew]:
                log.info(
                    "reload: what prepare resolved changed for %s too; renewing them",
                    ", ".join(more),
                    extra={"event": "reload"},
                )
            wanted = dataclasses.replace(wanted, renew=renew)
            self.enter(dataclasses.replace(phase, prepare=None, wanted=wanted))
        elif code != 0:
            log.error(
                "fatal: the model could not be prepared (%s; its log lines above say why)",
                describe_exit(code, killed_by_us=False),
                extra={"event": "fatal"},
            )
            self.enter(Ended(exitcodes.MODEL))  # nothing starts
        else:
            wanted = self.with_records(expect(phase, Preparing).wanted)
            self.shape = dataclasses.replace(self.shape, deployment=wanted.deployment)
            for child in self.roster.of("worker"):  # none has started yet
                child.respec(wanted.spec(child.name))
            self.enter(Starting(wanted))
            self.roll_out(self.system.now())

    @staticmethod
    def with_records(wanted: Wanted) -> Wanted:
        """`wanted` with each instance's spec carrying its pool's digest of the records
        prepare has just written: the one fact of what runs, in the specs."""
        return dataclasses.replace(wanted, deployment=with_records(wanted.deployment))

    # -- the control socket: `numaserve status` and `stop` ----------------------------------

    def answer_control(self, now: float) -> None:
        """A stop begins at once; a status is asked (`ask_status`)."""
        if self.control is None:
            return
        for request in self.control.requests(now):
            if request.op == "stop":
                self.begin_stop(f"numaserve stop ({request.who()})")
                request.answer({"stopping": self.system.pid()}, keep=True)
            else:
                self.ask_status(request, now)

    def ask_status(self, asker: Request | ShardQuestion, now: float) -> None:
        """A status question, on the control socket or passed on by a shard: it waits for a
        report from every shard that serves, asked for now, so that it shows what was served
        up to the question (STATUS_WAIT_S at most). Questions that come while the latest
        table's reports are awaited share them: a flood of status ops costs one table."""
        if not any(table == self.shards.sent for _, table, _ in self.asked_status):
            self.shards.want_reports()
            self.send_slots()
        self.asked_status.append((asker, self.shards.sent, now + protocol.STATUS_WAIT_S))

    def answer_status(self, now: float) -> None:
        """The questions whose reports have come (or whose time is up), each given the same
        answer, built once."""
        due = [
            asked
            for asked in self.asked_status
            if self.shards.serving_acked(asked[1]) or now >= asked[2]
        ]
        if not due:
            return
        answer = self.status_answer()
        for asked in due:
            self.asked_status.remove(asked)
            asked[0].answer(answer)

    def status_answer(self) -> dict:
        reports = [view.status for view in self.shards if view.status]
        if not reports:
            return {"error": f"no router shard has reported yet (the server is {self.summary()})"}
        table = self.slot_table()
        return {"status": server_report(table.slots, table.supervisor, reports).to_wire()}

    # -- what the shards, systemd and /metrics hear ------------------------------------------

    def send_slots(self) -> None:
        """Our slot table to every shard, for `numaserve status`: on a timer, and in the turn
        of every change of a child's state (`announce`), so that status never lags what
        systemd was told."""
        self.announced = self.states()
        self.shards.send(self.slot_table(), self.system.now())

    def states(self) -> tuple[tuple[str, State, int | None], ...]:
        """Each child's state and process, as the slot table says them."""
        return tuple((c.name, c.state, c.pid) for c in self.all_children())

    def announce(self) -> None:
        """The slot table to the shards where a child's state or process changed since the
        last one (whatever changed it this turn: an exit, a signal, a rollout, a stop)."""
        if self.states() != self.announced:
            self.send_slots()

    def slot_table(self) -> SlotTable:
        """What we say of ourselves and every slot of the plan. Each slot's live affinity is
        read here, so that no shard reads /proc in its request loop."""
        identity = self.system.identity()  # so that `numaserve stop` signals us and no other
        return SlotTable(
            supervisor=SupervisorInfo(
                pid=self.system.pid(),
                boot_id=identity["boot_id"],
                started=identity["started"],
                state=self.summary(),
                fronts=tuple(  # for `numaserve status` to show
                    Front(c.name, c.state.value, c.pid, c.binding.cpus) for c in self.roster.fronts
                ),
                seq=self.shards.sent,
            ),
            slots=tuple(
                c.slot(live_cpus=self.system.affinity(c.pid) if c.pid else None)
                for c in self.roster.workers.values()
            ),
            routers=tuple((c.shard, c.state.value) for c in self.roster.routers),
        )

    def summary(self) -> str:
        return reporting.summary(self.mood, self.roster.workers.values(), self.roster.routers)

    def snapshot(self, now: float):
        """The current processes: not those a reload retired, nor a replacement still
        starting under its slot's name."""
        roster = self.roster
        current = [
            *roster.routing(),
            *([self.prepare] if self.prepare else []),
            *roster.of("worker"),
        ]
        files = (c.spec_as(FrontSpec).stats_file for c in roster.fronts)
        stats = tuple(f for f in files if f)
        return reporting.snapshot(
            now, self.config, self.mood, current, self.shards, self.system.pid(), stats
        )

    def _notify(self, now: float) -> None:
        workers = self.roster.of("worker")
        serving = all(c.state == State.READY for c in self.roster.routing()) and any(
            w.state == State.READY for w in workers
        )
        settled = all(w.state in (State.READY, State.FATAL) for w in workers)
        # Every shard must have our latest slot table before systemd hears READY=1, so
        # that `numaserve status` asked right after it shows what systemd was told.
        current = self.shards.all_acked(self.shards.sent)
        ready = serving and settled and current and isinstance(self.phase, Starting)
        status = self.summary()
        if ready:
            self.enter(Serving())
            endpoint = self.config.server.endpoint
            log.info("serving on %s: %s", endpoint, status, extra={"event": "serving"})
        self.announcer.turn(now, status, ready)

    # -- timers ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.check_liveness(now)
        if not self.stopping:  # after any exit, and a spawn that failed
            code = liveness.cannot_serve(self.roster.routing(), self.roster.of("worker"))
            if code is not None:
                self.begin_stop("no instance can serve", code)
        self.roll_out(now)
        if self.stop is not None:
            roster = self.roster
            actions, code = self.stop.next_steps(
                roster.fronts, roster.routers, self.all_children(), now
            )
            self.carry_out(actions)
            if code is not None:
                self.enter(Ended(code))
        self.announce()
        self._notify(now)

    def roll_out(self, now: float) -> None:
        """The next step to the wanted deployment, if a start or reload is under way."""
        if self.wanted is not None:
            self.carry_out(rollout.next_steps(self.wanted, self.running(), now))

    def listening(self, front: Child) -> bool:
        """Whether a front's current process listens: it writes its stats file right after
        it does (fronts.py), with its pid, so the file of a process that could not listen,
        or of the one before, does not count."""
        path = front.spec_as(FrontSpec).stats_file
        if path is None:
            return True  # nothing to tell by: judged by its shards alone
        text = self.system.read_file(path)
        try:
            return text is not None and json.loads(text).get("pid") == front.pid
        except (ValueError, AttributeError):
            return False  # being written: the next turn reads it whole

    def check_liveness(self, now: float) -> None:
        """Each turn: who is ready, who is silent, who is late to stop, who may restart."""
        routed = self.shards.routed_pids(now)
        server = self.config.server
        roster = self.roster
        fronts = [(front, server.endpoint) for front in roster.of("frontend")]
        fronts += [
            (front, front.spec_as(FrontSpec).where())
            for front in roster.fronts
            if front.state != State.STARTING or self.listening(front)
        ]
        self.carry_out(liveness.fronts_ready(roster.routers, fronts, routed, server.endpoint))
        instances = [*roster.of("worker"), *([self.replacement] if self.replacement else [])]
        steady = liveness.limits(self.config, draining=False)
        self.carry_out(liveness.instances_heard(instances, routed, now, steady, self.stopping))
        # A router shard (a removed model's too) or a front finishes what it holds before
        # its kill timeout.
        draining = liveness.limits(self.config, draining=True)
        for child in self.all_children():
            drains = child.kind in ("router", "front")
            action = child.timers(now, draining if drains else steady, not self.stopping)
            if action is not None:
                self.carry_out([action])

    # -- carrying out what the parts decided -------------------------------------------------

    def carry_out(self, actions: Iterable[Action]) -> None:
        """The one place the decisions of the children, liveness, a rollout and a Stop change
        the server."""
        for action in actions:
            match action:
                case Spawn(child):
                    self.spawn(child)
                case Signal(child, sig):
                    self.signal(child, sig)
                case Terminate(child, state):
                    self.terminate(child, state)
                case Announce(child, state, message, event):
                    self.set_state(child, state, message, event)
                case _:
                    self.reshape(action)

    def reshape(self, action: Action) -> None:
        """A rollout step that changes which children run, or what runs."""
        match action:
            case Adopt(child):  # a shard's link is made as it joins (ShardLinks.views)
                self.roster.join(child)
            case Leave(child, drain):
                self.leave(child, drain)
            case Renew(new):
                self.enter(dataclasses.replace(expect(self.phase, Reloading), replacement=new))
                self.spawn(new)
            case Replace(new):
                self.enter(dataclasses.replace(expect(self.phase, Reloading), replacement=None))
                old = self.roster.workers[new.name]
                self.roster.replace(old, new)
                self.terminate(old)
            case Reroute(spec):
                frontend = self.roster.frontend
                if frontend is None or spec.routes_file is None:
                    raise PhaseError("a reroute without a frontend that routes by a file")
                self.system.write_file(spec.routes_file, spec.to_json())
                frontend.respec(spec)  # a restart reads the new routes too
                self.signal(frontend, signal.SIGHUP)
            case RenewFronts(fronts):
                self.renew_fronts(fronts)
            case _:
                self.progress(action)

    def progress(self, action: Action) -> None:
        """A rollout step that changes what runs, or ends the start or reload."""
        match action:
            case Hold(plan):
                self.hold(plan)
            case Reshaped(shape):
                self.shape = shape  # a retry compares with what runs now
            case Started():
                self.enter(Starting())  # liveness looks after them from here
            case Renewed():
                self.finish_reload()
            case Abort(why):
                self.abort_reload(why)
            case _:
                raise TypeError(f"no such action: {action!r}")

    def leave(self, child: Child, drain: bool) -> None:
        """A removed model's child out of the running set, reaped as retired."""
        self.roster.retire(child)  # a shard's link closes with it (ShardLinks.views)
        if drain:
            self.terminate(child)

    def renew_fronts(self, fronts: tuple[Child, ...]) -> None:
        """The fronts for the new models: each new one starts beside the old, on the same
        port (SO_REUSEPORT), and the old one drains; no connection is refused meanwhile."""
        old = self.roster.fronts
        for child in fronts:
            self.roster.join(child)
            self.spawn(child)
        for child in old:
            self.roster.retire(child)
            self.terminate(child)

    def hold(self, plan: Plan) -> None:
        """Our ledger entry, holding what `plan` holds."""
        ledger = self.site.ledger
        if not ledger:
            return
        try:
            with ledger.locked():
                ledger.update(held_cpus(plan, self.topo))
        except OSError as e:
            log.error(
                "the core ledger entry could not be updated: %s", e, extra={"event": "ledger"}
            )

    # -- reloading ---------------------------------------------------------------------------

    def begin_reload(self) -> None:
        """SIGHUP: the config file read again and its reload begun, unless one is under way."""
        if self.stopping:
            return
        if self.wanted:
            what = "preparing the model" if isinstance(self.phase, Preparing) else "reload"
            log.info("%s already under way; SIGHUP ignored", what, extra={"event": "reload"})
            return
        wanted = plan_reload(self.site, self.running(), self.mood)
        if wanted is None:
            return
        if not needs_new_artifacts(self.config, wanted.config):
            self.enter(Reloading(wanted))
            return
        prepare = self.prepare_child()
        self.enter(Reloading(wanted, prepare))
        self.spawn(prepare)
        if self.prepare is not None:  # it could be started
            log.info(
                "reload: preparing the new or changed model(s) before any instance (re)starts",
                extra={"event": "reload"},
            )

    def finish_reload(self) -> None:
        """Every slot renewed: done once every serving shard has answered the slot table that
        shows it, so that `numaserve status` asked after `reload: done` shows the new
        instances."""
        reload = expect(self.phase, Reloading)
        if reload.final_table is None:
            self.send_slots()
            reload = dataclasses.replace(reload, final_table=self.shards.sent)
            self.enter(reload)
        if reload.final_table is None or not self.shards.serving_acked(reload.final_table):
            return
        self.shape = dataclasses.replace(self.shape, config=reload.wanted.config)
        log.info("reload: done", extra={"event": "reload"})
        self.enter(Starting())  # READY=1 again for systemd, once it serves

    def abort_reload(self, why: str) -> None:
        """Back to what runs: the replacement starting and the model being prepared stop."""
        reload = expect(self.phase, Reloading)
        wanted, prepare, replacement = reload.wanted, reload.prepare, reload.replacement
        self.enter(Serving() if wanted.resume is Mood.SERVING else Starting())
        if not wanted.reshaped(self.running()) and wanted.plan != self.plan:
            self.hold(self.plan)  # the cores it would have added are not ours
        if prepare is not None:
            self.roster.retire(prepare)  # reaped as a replaced process
            self.terminate(prepare)
        if replacement and replacement.pid is not None:
            self.roster.retire(replacement)
            self.terminate(replacement)
        log.error(
            "reload aborted (%s); the running instances keep serving",
            why,
            extra={"event": "reload"},
        )

    # -- stopping ----------------------------------------------------------------------------

    def begin_stop(self, why: str, code: int = 0) -> None:
        """`code`: the exit code once stopped, where the stop is a failure."""
        if self.stopping:
            return
        if self.reloading:
            self.abort_reload("stopping")
        prepare = self.prepare  # the start's: it stops with the rest, reaped as retired
        stop = Stop(code)
        self.enter(Stopping(stop))
        if prepare:
            self.roster.retire(prepare)
            self.terminate(prepare)
        drain_s = self.config.supervisor.drain_timeout_s
        self.carry_out(stop.begin(why, drain_s, self.roster.fronts, self.system.now()))

    def close(self) -> None:
        if self.control is not None:
            self.control.close(farewell={"stopped": self.exit_code})
        self.shards.close()
        self.notifier.close()
