"""The supervisor's decisions on plain objects and a number for the clock: each child's own
timers, a rollout's steps and a Stop's order, as the actions they return. No Supervisor
carries them out here (the Rig only builds a real deployment's children, and starts nothing);
tests/test_supervisor_states.py runs the same decisions through the arbiter on a fake OS."""

import signal
from dataclasses import replace

import pytest

from numaserve.processes import exitcodes
from numaserve.supervisor.children import Announce, Child, Limits, Signal, Spawn, State, Terminate
from numaserve.supervisor.reporting import Mood, summary
from numaserve.supervisor.rollout import (
    Abort,
    Renew,
    Replace,
    Running,
    Started,
    Wanted,
    next_steps,
    to_renew,
)
from numaserve.supervisor.roster import Roster
from numaserve.supervisor.stop import Stop
from tests.harness.fake_system import Rig

LIMITS = Limits(start_timeout_s=60, silence_s=4, kill_after_s=10)


@pytest.fixture
def rig(tmp_path) -> Rig:
    return Rig(tmp_path)


def started(child: Child, pid: int, now: float = 0.0, state: State = State.STARTING) -> Child:
    child.change_state(State.STARTING, now)
    child.spawned(pid, now)
    if state is not State.STARTING:
        child.change_state(state, now)
    return child


# -- a child's own timers ------------------------------------------------------------------------


def test_a_starting_child_is_announced_ready_once_its_shard_hears_it(rig):
    child = started(rig.sup.roster.workers["main-0"], pid=7)
    action = child.judge_start(1.0, routed={7}, limits=LIMITS)
    assert action == Announce(child, State.READY, "ready main-0 pid 7 in 1.0 s", "ready")
    assert child.state is State.STARTING  # the arbiter carries it out


def test_a_child_late_to_start_is_killed_once(rig):
    child = started(rig.sup.roster.workers["main-0"], pid=7)
    assert child.judge_start(60.0, routed=set(), limits=LIMITS) is None
    assert child.judge_start(61.0, routed=set(), limits=LIMITS) == Signal(child, signal.SIGKILL)
    assert child.judge_start(62.0, routed=set(), limits=LIMITS) is None


def test_a_ready_child_silent_past_the_limit_gets_sigterm_then_sigkill(rig):
    child = started(rig.sup.roster.workers["main-0"], pid=7, state=State.READY)
    assert child.judge_heard(1.0, routed=set(), limits=LIMITS) is None  # silent from now
    assert child.judge_heard(5.0, routed=set(), limits=LIMITS) is None
    assert child.judge_heard(5.1, routed=set(), limits=LIMITS) == Signal(child, signal.SIGTERM)
    assert child.timers(15.0, LIMITS, may_restart=True) is None
    assert child.timers(15.2, LIMITS, may_restart=True) == Signal(child, signal.SIGKILL)
    assert child.timers(99.0, LIMITS, may_restart=True) is None  # once


def test_a_child_heard_again_is_no_longer_counted_silent(rig):
    child = started(rig.sup.roster.workers["main-0"], pid=7, state=State.READY)
    child.judge_heard(1.0, routed=set(), limits=LIMITS)
    child.judge_heard(3.0, routed={7}, limits=LIMITS)
    assert child.judge_heard(6.0, routed=set(), limits=LIMITS) is None


def test_a_crash_backs_off_and_the_restart_waits_for_it_and_counts(rig):
    child = started(rig.sup.roster.workers["main-0"], pid=7, state=State.READY)
    child.exited(1)
    action = child.crashed(1, 1.0, rig.sup.config.supervisor)
    assert action == Announce(
        child, State.BACKOFF, "backoff main-0: restarting in 0.5 s", "backoff"
    )
    child.change_state(State.BACKOFF, 1.0)
    assert child.timers(1.4, LIMITS, may_restart=True) is None
    assert child.timers(1.5, LIMITS, may_restart=False) is None  # stopping: no restart
    assert child.timers(1.5, LIMITS, may_restart=True) == Spawn(child)
    assert child.restarts == 1


def test_an_exit_no_restart_can_fix_is_fatal(rig):
    child = started(rig.sup.roster.workers["main-0"], pid=7, state=State.READY)
    child.exited(exitcodes.MODEL)
    action = child.crashed(exitcodes.MODEL, 1.0, rig.sup.config.supervisor)
    assert action.state is State.FATAL and action.child is child


# -- a rollout's steps ---------------------------------------------------------------------------


def test_the_start_spawns_every_process_then_ends(rig):
    running = rig.sup.running()
    start = Wanted.start(running.config, running.plan, running.deployment)
    actions = next_steps(start, running, now=0.0)
    spawned = [a.child.name for a in actions if isinstance(a, Spawn)]
    assert spawned == ["router", "main-0", "main-1"]
    assert actions[-1] == Started()


def test_nothing_starts_while_the_model_is_prepared(rig):
    running = rig.sup.running()
    start = Wanted.start(running.config, running.plan, running.deployment)
    assert next_steps(start, replace(running, preparing=True), now=0.0) == []


def test_a_reload_renews_one_slot_at_a_time_and_swaps_once_the_new_one_is_ready(rig):
    """How far it has come is read from what runs: the same question, asked again, has the
    same answer until what runs changes."""
    for pid, child in enumerate(
        [*rig.sup.roster.routers, *rig.sup.roster.workers.values()], start=10
    ):
        started(child, pid, state=State.READY)
    rig.sup.roster.workers["main-0"].restarts = 2
    running = replace(rig.sup.running(), generation=1)  # its shape taken up: the slots remain
    reload = Wanted(
        running.config, running.plan, running.deployment, ("main-0", "main-1"), generation=1
    )
    (renew,) = next_steps(reload, running, now=1.0)
    (again,) = next_steps(reload, running, now=1.0)  # nothing was kept: the same step
    assert again.new.name == "main-0" and again.new.spec == renew.new.spec
    new = renew.new
    assert renew == Renew(new) and new.name == "main-0" and new.restarts == 2
    assert new.generation == 1  # the reload's: its slot counts as renewed once it runs there
    assert new is not running.roster.workers["main-0"]
    started(new, pid=20, now=1.0)
    starting = replace(running, replacement=new)
    assert next_steps(reload, starting, now=2.0) == []  # it is starting: nothing else moves
    new.change_state(State.READY, 3.0)
    assert next_steps(reload, starting, now=3.0) == [Replace(new)]
    swapped = replace(with_instance(starting, new), replacement=None)
    assert to_renew(reload, swapped) == ["main-1"]


def with_instance(running: Running, child: Child) -> Running:
    """`running` with `child` as its slot's instance, in a copy of the roster."""
    roster = Roster(list(running.roster.running))
    roster.replace(roster.workers[child.name], child)
    return replace(running, roster=roster)


def test_a_rollouts_progress_is_read_by_value_not_by_the_identity_of_what_runs(rig):
    running = rig.sup.running()
    equal = replace(running.config)  # an equal config, not the same object
    reload = Wanted(equal, running.plan, running.deployment, ("main-0",), generation=1)
    assert not reload.reshaped(running)  # the start's shape, generation 0, runs
    assert reload.reshaped(replace(running, generation=1))
    assert to_renew(reload, running) == ["main-0"]
    worker = running.roster.workers["main-0"]
    again = replace(worker, generation=1)  # the same slot, its instance of the reload's
    assert to_renew(reload, with_instance(running, again)) == []


def test_a_replacement_not_ready_in_time_aborts_the_reload(rig):
    running = replace(rig.sup.running(), generation=1)
    reload = Wanted(running.config, running.plan, running.deployment, ("main-0",), generation=1)
    (renew,) = next_steps(reload, running, now=0.0)
    started(renew.new, pid=20, now=0.0)
    starting = replace(running, replacement=renew.new)
    assert next_steps(reload, starting, now=60.0) == []
    assert next_steps(reload, starting, now=60.5) == [Abort("the new main-0 was not ready in time")]


# -- a stop's order ------------------------------------------------------------------------------


def test_a_stop_drains_the_fronts_then_the_shards_then_the_rest(tmp_path):
    rig = Rig(tmp_path, http="127.0.0.1:18080")  # never listened on: a fake OS
    sup = rig.sup
    for pid, child in enumerate(sup.all_children(), start=10):
        started(child, pid, state=State.READY)
    stop = Stop()
    assert stop.begin("SIGTERM", 30, sup.roster.fronts, 0.0) == [
        Terminate(c) for c in sup.roster.fronts
    ]
    for child in sup.roster.fronts:
        child.terminating(State.DRAINING, 0.0)
    assert stop.next_steps(sup.roster.fronts, sup.roster.routers, sup.all_children(), 1.0) == (
        [],
        None,
    )
    for child in sup.roster.fronts:
        child.exited(0)
    actions, code = stop.next_steps(sup.roster.fronts, sup.roster.routers, sup.all_children(), 2.0)
    assert (actions, code) == ([Terminate(c) for c in sup.roster.routers], None)
    for child in sup.roster.routers:
        child.terminating(State.DRAINING, 2.0)
        child.exited(0)
    actions, code = stop.next_steps(sup.roster.fronts, sup.roster.routers, sup.all_children(), 3.0)
    assert (actions, code) == ([Terminate(c) for c in sup.roster.workers.values()], None)
    for child in sup.roster.workers.values():
        child.terminating(State.DRAINING, 3.0)
        child.exited(0)
    assert stop.next_steps(sup.roster.fronts, sup.roster.routers, sup.all_children(), 4.0) == (
        [],
        0,
    )
    assert {c.state for c in sup.all_children()} == {State.STOPPED}


def test_a_fast_stop_kills_every_process_once_and_exits_as_sigint_does(rig):
    children = rig.sup.all_children()
    for pid, child in enumerate(children, start=10):
        started(child, pid, state=State.READY)
    fast, kills = Stop().kill(children)
    assert kills == [Signal(c, signal.SIGKILL) for c in children]
    assert all(c.timers(1e9, LIMITS, may_restart=False) is None for c in children)
    for child in children:
        child.exited(-signal.SIGKILL)
    assert fast.next_steps([], [], children, 1.0)[1] == 128 + signal.SIGINT


def test_the_state_line_counts_the_shards_by_state_not_one_word_each():
    workers = [Child(f"main-{i}", [], state=State.READY) for i in range(2)]
    one = [Child("router", [], state=State.READY)]
    two = [Child(f"router-{i}", [], state=State.READY) for i in range(2)]
    mixed = [*two[:1], Child("router-1", [], state=State.STARTING)]
    assert summary(Mood.SERVING, workers, one) == "2 ready; router ready"
    assert summary(Mood.SERVING, workers, two) == "2 ready; routers ready"
    assert summary(Mood.SERVING, workers, mixed) == "2 ready; routers: 1 ready, 1 starting"
