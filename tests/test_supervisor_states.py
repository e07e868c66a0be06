"""The supervisor's state machine, every transition, on a FAKE OS (tests/harness/fake_system.py):
no process is started and the clock moves only when a test moves it. The same supervisor
runs real processes in tests/test_supervisor.py (slow)."""

import json
import logging
import signal
from pathlib import Path

import pytest

from numaserve.config.paths import ModelPath, PoolPath
from numaserve.config.ports import Ports
from numaserve.processes import exitcodes
from numaserve.processes.prepared import Prepared
from numaserve.supervisor.children import Child, State, TransitionError
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.rollout import to_renew
from numaserve.supervisor.stop import FAST_STOP_EXIT
from tests.harness.fake_system import Rig, spec_of


@pytest.fixture
def rig(tmp_path) -> Rig:
    return Rig(tmp_path)


# -- starting ----------------------------------------------------------------------------------


def test_every_process_starts_and_a_worker_is_ready_once_the_router_hears_it(rig):
    rig.sup.begin()
    assert rig.states() == {"main-0": "starting", "main-1": "starting"}
    assert rig.sup.roster.routers[0].state.value == "starting"
    rig.router.quiet.add("main-1")  # still loading its model
    rig.step()
    assert rig.states() == {"main-0": "ready", "main-1": "starting"}
    assert rig.sup.roster.routers[0].state.value == "ready"
    assert "READY" not in rig.notifier.kinds()  # not every instance is ready yet
    rig.router.quiet.clear()
    rig.step(seconds=0.1)
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}
    rig.step(seconds=0.1)  # once the router has the table that says so
    assert rig.notifier.kinds() == ["READY"]


def test_with_two_shards_the_frontend_is_ready_once_a_shard_answers_before_any_worker_is(
    tmp_path,
):
    rig = Rig(tmp_path, routers=2)
    rig.sup.begin()
    assert rig.sup.roster.frontend.state.value == "starting"
    rig.router.quiet.update(rig.sup.roster.workers)  # every worker still loading its model
    rig.shards[1].quiet.update(rig.sup.roster.workers)
    rig.step()
    assert [r.state.value for r in rig.sup.roster.routers] == ["ready", "ready"]
    assert rig.sup.roster.frontend.state.value == "ready"
    assert rig.states() == {"main-0": "starting", "main-1": "starting"}


def test_a_restarted_worker_keeps_its_slot_and_cpus(rig):
    rig.start()
    before = rig.os.argv[rig.pid("main-1")]
    rig.crash("main-1")
    rig.run_for(1)
    assert rig.states()["main-1"] == "ready"
    assert rig.os.argv[rig.pid("main-1")] == before  # the same WorkerSpec: CPUs, node, name
    assert rig.sup.roster.workers["main-1"].restarts == 1


def test_nothing_is_judged_while_the_router_does_not_answer(rig):
    rig.sup.begin()
    rig.os.exit(rig.pid("router"), 1)  # the router dies before it ever answers
    rig.step()
    assert rig.states() == {"main-0": "starting", "main-1": "starting"}
    assert rig.sup.roster.routers[0].state.value == "backoff"


def test_a_worker_not_ready_within_the_start_timeout_is_killed_and_backs_off(rig):
    rig.router.quiet.add("main-0")
    rig.sup.begin()
    rig.run_for(59.9, every=1.0)
    assert rig.states()["main-0"] == "starting"
    rig.step(seconds=1)
    assert rig.os.signals_to("main-0") == [signal.SIGKILL]
    rig.step()
    child = rig.sup.roster.workers["main-0"]
    assert child.state.value == "backoff"
    assert child.last_exit == "killed by SIGKILL"  # numaserve's own kill: no OOM hint


def test_a_spawn_that_fails_makes_the_slot_fatal_and_with_none_left_the_server_stops(rig):
    rig.os.spawn_error = FileNotFoundError(2, "No such file or directory")
    rig.sup.begin()
    assert rig.states() == {"main-0": "fatal", "main-1": "fatal"}
    rig.step()
    assert rig.sup.exit_code == 1  # nothing can serve: the server stops, and says so


# -- exits, backoff and fatal ------------------------------------------------------------------


def test_quick_exits_back_off_doubling_up_to_the_maximum(tmp_path):
    rig = Rig(tmp_path, max_quick_exits=10)
    rig.start()
    delays = []
    for _ in range(6):
        delays.append(rig.crash("main-0"))
        rig.restart_after(delays[-1])  # ready again, but not for stable_s
        assert rig.states()["main-0"] == "ready"
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_backoff_starts_over_after_an_uptime_of_stable_s(rig):
    rig.start()
    first = rig.crash("main-0")
    rig.restart_after(first)
    second = rig.crash("main-0")
    rig.restart_after(second)
    rig.run_for(5.0)  # READY for stable_s: it was up, the next exit is not a quick one
    third = rig.crash("main-0")
    assert (first, second, third) == (0.5, 1.0, 0.5)
    assert rig.sup.roster.workers["main-0"].quick_exits == 0


def test_max_quick_exits_in_a_row_make_a_slot_fatal_and_the_others_keep_serving(rig, caplog):
    rig.start()
    for _ in range(2):
        rig.restart_after(rig.crash("main-0"))
    rig.crash("main-0")
    assert rig.states() == {"main-0": "fatal", "main-1": "ready"}
    assert "fatal: main-0 exited 3 times in a row before it had been ready for 5 s" in caplog.text
    rig.run_for(60, every=5)
    assert rig.states() == {"main-0": "fatal", "main-1": "ready"}  # never restarted
    assert not rig.sup.stopping


@pytest.mark.parametrize("code", sorted(exitcodes.NEVER_RESTART))
def test_an_exit_that_a_restart_cannot_fix_is_fatal_at_once(rig, code):
    rig.start()
    rig.crash("main-0", code)
    child = rig.sup.roster.workers["main-0"]
    assert child.state.value == "fatal"
    assert child.last_exit == f"exit {code} ({exitcodes.DESCRIPTION[code]})"


def test_when_every_worker_is_fatal_the_server_stops_with_their_exit_code(rig):
    rig.start()
    rig.crash("main-0", exitcodes.MODEL)
    rig.crash("main-1", exitcodes.MODEL)
    assert rig.sup.stopping
    rig.os.exit(rig.pid("router"), 0)  # it drained
    rig.step()
    assert rig.sup.exit_code == exitcodes.MODEL


def test_a_fatal_router_stops_the_server(tmp_path):
    rig = Rig(tmp_path, max_quick_exits=1)
    rig.start()
    rig.crash("router")
    assert rig.sup.roster.routers[0].state.value == "fatal"
    rig.step()  # the workers get SIGTERM once no router is left to drain
    for name in ("main-0", "main-1"):
        rig.exit(name, 0)
    rig.step()
    assert rig.sup.exit_code == 1


@pytest.mark.parametrize("number", range(1, signal.SIGRTMAX + 1))
def test_an_exit_by_any_signal_number_backs_off_and_says_which(rig, number):
    rig.start()
    delay = rig.crash("main-0", -number)
    child = rig.sup.roster.workers["main-0"]
    assert (child.state.value, delay) == ("backoff", 0.5)
    assert child.last_exit.startswith(f"killed by {exitcodes.signal_name(number)}")
    rig.restart_after(delay)
    assert rig.states()["main-0"] == "ready"


def test_a_sigkill_numaserve_did_not_send_points_at_the_oom_killer(rig):
    rig.start()
    rig.crash("main-0", -signal.SIGKILL)
    assert "out-of-memory killer" in rig.sup.roster.workers["main-0"].last_exit


# -- a hung instance ---------------------------------------------------------------------------


def test_a_ready_worker_the_router_stops_hearing_gets_sigterm_then_sigkill_and_restarts(rig):
    rig.start()
    hung = rig.pid("main-0")
    rig.router.quiet.add("main-0")
    rig.run_for(4.0)  # 2 x 3 heartbeats of 0.5 s + 1 s: not yet
    assert rig.os.signals_to("main-0") == []
    rig.run_for(0.5)
    assert rig.os.signals_to("main-0") == [signal.SIGTERM]
    rig.run_for(10.5)  # supervisor.kill_timeout_s
    assert rig.os.signals_to("main-0") == [signal.SIGTERM, signal.SIGKILL]
    rig.router.quiet.clear()
    rig.run_for(1.0)
    assert rig.states()["main-0"] == "ready"
    assert rig.pid("main-0") != hung


# -- stopping ----------------------------------------------------------------------------------


def test_sigterm_drains_the_router_first_then_stops_the_workers_and_exits_0(rig):
    rig.start()
    rig.step(signal.SIGTERM)
    assert rig.os.signals_to("router") == [signal.SIGTERM]
    assert rig.os.signals_to("main-0") == []  # they answer what the router has in flight
    assert "STOPPING" in rig.notifier.kinds()
    rig.run_for(5.0)
    assert rig.os.signals_to("main-0") == []
    rig.exit("router", 0)
    rig.step()
    assert rig.states() == {"main-0": "draining", "main-1": "draining"}
    assert rig.os.signals_to("main-0") == [signal.SIGTERM]
    rig.exit("main-0", 0)
    rig.exit("main-1", 0)
    rig.step()
    assert rig.states() == {"main-0": "stopped", "main-1": "stopped"}
    assert rig.sup.exit_code == 0


def test_a_router_that_does_not_drain_in_time_gets_sigkill(rig):
    rig.start()
    rig.step(signal.SIGTERM)
    rig.run_for(39.9, every=1.0)  # drain_timeout_s + kill_timeout_s
    assert rig.os.signals_to("router") == [signal.SIGTERM]
    rig.run_for(2.0, every=1.0)
    assert rig.os.signals_to("router") == [signal.SIGTERM, signal.SIGKILL]


def test_a_crash_while_stopping_is_not_restarted(rig):
    rig.start()
    rig.step(signal.SIGTERM)
    rig.crash("main-0")
    assert rig.states()["main-0"] == "stopped"


def test_a_second_sigint_kills_every_process_and_exits_130(rig):
    rig.start()
    rig.step(signal.SIGINT)
    assert rig.os.signals_to("router") == [signal.SIGTERM]
    rig.step(signal.SIGINT)
    assert rig.os.running == {}
    rig.step()
    assert rig.sup.exit_code == FAST_STOP_EXIT == 130


# -- reloading ---------------------------------------------------------------------------------


def test_sighup_restarts_one_slot_at_a_time_each_old_one_after_its_replacement_is_ready(rig):
    rig.start()
    old = {name: rig.pid(name) for name in ("main-0", "main-1")}
    rig.step(signal.SIGHUP)
    assert rig.notifier.kinds()[-1] == "RELOADING"
    new0 = rig.sup.replacement.pid
    rig.router.quiet.add(new0)  # hold the first replacement in STARTING
    assert rig.os.running[new0] == "main-0" and old["main-0"] in rig.os.running
    rig.run_for(1.0)
    assert rig.os.signals_to("main-0") == []  # the old one serves until its replacement is READY
    assert to_renew(rig.sup.wanted, rig.sup.running()) == ["main-0", "main-1"]  # both old
    rig.router.quiet.clear()
    rig.step(seconds=0.3)  # main-0's replacement is heard
    rig.step()
    assert rig.os.signals_to("main-0") == [signal.SIGTERM]
    assert rig.pid("main-0") == new0
    rig.os.exit(old["main-0"], 0)
    rig.run_for(1.0)
    assert rig.sup.wanted is None
    assert rig.pid("main-1") != old["main-1"]
    assert rig.os.signals_to("main-1") == [signal.SIGTERM]
    assert rig.notifier.kinds()[-1] == "READY"  # told again once the reload is done


def test_a_reload_is_done_only_once_the_router_shows_the_new_instances(rig):
    """So that `numaserve status` asked after `reload: done` shows the new instances' pids."""
    rig.start()
    rig.step(signal.SIGHUP)
    rig.step(seconds=0.3)  # main-0's replacement is heard
    rig.step()
    rig.step(seconds=0.3)  # main-1's
    rig.router.behind = True
    rig.run_for(1.0)
    assert rig.sup.wanted is not None
    assert to_renew(rig.sup.wanted, rig.sup.running()) == [] and rig.sup.replacement is None
    rig.router.behind = False
    rig.step()
    rig.step()
    assert rig.sup.wanted is None
    pids = {s["name"]: s["pid"] for s in rig.router.tables[-1]["slots"]}
    assert pids == {name: rig.pid(name) for name in ("main-0", "main-1")}


def test_a_reload_whose_replacement_dies_is_aborted_and_the_old_instance_keeps_serving(rig):
    rig.start()
    old = rig.pid("main-0")
    rig.step(signal.SIGHUP)
    rig.os.exit(rig.sup.replacement.pid, exitcodes.MODEL)
    rig.step()
    assert rig.sup.wanted is None
    assert rig.pid("main-0") == old
    assert rig.os.signals_to("main-0") == []


def test_a_reload_whose_replacement_is_not_ready_in_time_is_aborted(rig):
    rig.start()
    rig.step(signal.SIGHUP)
    new = rig.sup.replacement.pid
    rig.router.quiet.add(new)
    rig.run_for(61, every=1.0)
    assert rig.sup.wanted is None
    assert new not in rig.os.running
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}


def test_a_reload_of_a_broken_config_keeps_the_running_config(rig):
    rig.start()
    rig.config_path.write_text("placement: {pools: nonsense}")
    rig.step(signal.SIGHUP)
    assert rig.sup.wanted is None
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}


def test_a_reload_that_would_move_running_instances_is_refused_and_they_serve_on(rig, caplog):
    """One rule for both forms of config: a kept model's pools keep their shape until a
    restart (a replacement pinned by a new plan could land on cores an old instance holds)."""
    rig.start()
    before = {name: rig.pid(name) for name in ("main-0", "main-1")}
    rig.write_config(instances=3)
    rig.step(signal.SIGHUP)
    assert rig.sup.wanted is None
    assert "reload failed, keeping the running config" in caplog.text
    assert "Restart the server for that" in caplog.text and "add it back" not in caplog.text
    assert {name: rig.pid(name) for name in before} == before


def test_a_reload_from_model_to_models_is_refused(rig, caplog):
    rig.start()
    rig.config_path.write_text(TWO_MODELS)
    rig.step(signal.SIGHUP)
    assert rig.sup.wanted is None
    assert "went from `model:` to `models:`" in caplog.text
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}


def test_a_placement_setting_a_reload_cannot_apply_is_logged(rig, caplog):
    rig.start()
    rig.config_path.write_text(
        rig.config_path.read_text().replace("placement:\n", "placement:\n  reserved_cores: 2\n")
    )
    rig.step(signal.SIGHUP)
    assert "placement.reserved_cores changed" in caplog.text
    assert rig.sup.wanted is not None  # the rest applies: every instance renews


def test_a_reload_keeps_the_ports_the_command_line_moved(tmp_path, caplog):
    rig = Rig(tmp_path, ports=Ports(zmq=6001, metrics=9999))
    rig.start()
    rig.step(signal.SIGHUP)
    rig.run_for(3.0)
    assert rig.sup.config.server.endpoint == "tcp://127.0.0.1:6001"
    assert rig.sup.config.server.metrics.endswith(":9999")
    assert "changed" not in caplog.text  # nothing to apply at a restart


def test_sigterm_during_a_reload_aborts_it_and_stops(rig):
    rig.start()
    rig.step(signal.SIGHUP)
    replacement = rig.sup.replacement.pid
    rig.step(signal.SIGTERM)
    assert rig.sup.wanted is None
    assert rig.os.signals_to("main-0")[0] == signal.SIGTERM  # the replacement, retired
    rig.os.exit(replacement, 0)
    rig.exit("router", 0)
    rig.step()
    rig.exit("main-0", 0)
    rig.exit("main-1", 0)
    rig.step()
    assert rig.sup.exit_code == 0


# -- preparing the model (the ONNX Runtime backend) --------------------------------------------


def test_the_model_is_prepared_before_any_instance_starts(tmp_path):
    rig = Rig(tmp_path, backend="onnxruntime")
    rig.sup.begin()
    assert set(rig.os.running.values()) == {"prepare"}
    rig.run_for(30, every=5)
    assert set(rig.os.running.values()) == {"prepare"}  # a first build takes its time
    assert rig.sup.wanted is not None  # the start's, waiting for the artifact
    rig.os.exit(rig.os.pid_of("prepare"), 0)
    rig.step()
    assert set(rig.os.running.values()) == {"router", "main-0", "main-1"}
    assert rig.sup.wanted is None


def test_the_start_is_a_rollout_that_starts_every_process_in_its_first_step_and_ends(rig):
    rig.sup.begin()
    assert set(rig.os.running.values()) == {"router", "main-0", "main-1"}
    assert rig.sup.wanted is None  # from here on liveness restarts what exits


def test_a_model_that_cannot_be_prepared_exits_with_the_model_code_and_starts_nothing(tmp_path):
    rig = Rig(tmp_path, backend="onnxruntime")
    rig.sup.begin()
    rig.os.exit(rig.os.pid_of("prepare"), exitcodes.MODEL)
    rig.step()
    assert rig.sup.exit_code == exitcodes.MODEL
    assert rig.os.running == {}


def test_sigterm_while_preparing_stops_the_preparation_and_exits_0(tmp_path):
    rig = Rig(tmp_path, backend="onnxruntime")
    rig.sup.begin()
    rig.step(signal.SIGTERM)
    assert rig.os.signals_to("prepare") == [signal.SIGTERM]
    rig.os.exit(rig.os.pid_of("prepare"), -signal.SIGTERM)
    rig.step()
    assert rig.sup.exit_code == 0
    assert rig.os.running == {}


def reload_a_changed_onnx_model(tmp_path) -> Rig:
    """A serving ONNX Runtime server, sent SIGHUP after its config names another model."""
    rig = Rig(tmp_path, backend="onnxruntime")
    rig.sup.begin()
    rig.os.exit(rig.os.pid_of("prepare"), 0)
    rig.step()
    rig.step()
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}
    rig.config_path.write_text(rig.config_path.read_text().replace("minilm", "minilm-copy"))
    rig.step(signal.SIGHUP)
    return rig


def test_a_reload_that_changes_the_model_prepares_it_before_restarting_any_instance(tmp_path):
    rig = reload_a_changed_onnx_model(tmp_path)
    rig.run_for(5)
    assert sorted(rig.os.running.values()) == ["main-0", "main-1", "prepare", "router"]
    rig.os.exit(rig.os.pid_of("prepare"), 0)
    rig.step()
    assert rig.sup.replacement is not None


def write_record(path: str, digest: str) -> Prepared:
    """What `numaserve prepare` writes for a model (the fake OS runs no prepare): its
    checkpoint's `digest`, and pool main's path."""
    record = Prepared(
        "bundled:minilm",
        "/checkpoint",
        digest,
        {"main": PoolPath(ModelPath("onnxruntime", "none"), artifact="/artifacts/model.onnx")},
    )
    record.write(Path(path))
    return record


def test_each_instances_spec_carries_its_pools_digest_of_what_prepare_resolved(tmp_path):
    rig = Rig(tmp_path, backend="onnxruntime")
    rig.sup.begin()
    path = rig.sup.wanted.spec("main-0").prepared
    record = write_record(path, digest="d1")
    rig.os.exit(rig.os.pid_of("prepare"), 0)
    rig.step()
    for name in ("main-0", "main-1"):  # as spawned
        spec = spec_of(rig.os.argv[rig.pid(name)])
        assert spec["prepared"] == path
        assert spec["prepared_digest"] == record.pool_digest("main")


def test_a_reload_renews_the_instances_whose_prepared_record_changed_and_keeps_the_others(
    tmp_path,
):
    rig = Rig(tmp_path, config_text=TWO_PREPARED)
    rig.sup.begin()
    paths = {m: rig.sup.wanted.spec(f"{m}.main-0").prepared for m in ("a", "b")}
    for path in paths.values():
        write_record(path, digest="d1")
    rig.os.exit(rig.os.pid_of("prepare"), 0)
    rig.step()
    rig.step()
    assert rig.states() == {"a.main-0": "ready", "b.main-0": "ready"}
    old = rig.pid("b.main-0")
    write_record(paths["b"], digest="d2")  # b's checkpoint changed, and was prepared again
    rig.step(signal.SIGHUP)  # the same config: only b's record is new
    assert rig.sup.wanted.renew == ("b.main-0",)
    rig.step(seconds=0.3)  # b's replacement is heard
    rig.step()
    rig.os.exit(old, 0)
    rig.run_for(1.0)
    assert rig.sup.wanted is None and rig.pid("b.main-0") != old
    rig.step(signal.SIGHUP)  # nothing changed since: nothing renews
    assert rig.sup.wanted.renew == ()


def test_a_reload_whose_model_cannot_be_prepared_is_aborted(tmp_path):
    rig = reload_a_changed_onnx_model(tmp_path)
    rig.os.exit(rig.os.pid_of("prepare"), exitcodes.MODEL)
    rig.step()
    assert rig.sup.wanted is None
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}


# -- what the router and systemd are told ------------------------------------------------------


def test_every_change_of_state_sends_the_router_a_new_slot_table(rig):
    rig.start()
    rig.crash("main-1")
    table = rig.router.tables[-1]
    assert table["pid"] == 1 and table["boot_id"] == "fake-boot"  # whose status this is
    assert {s["name"]: s["state"] for s in table["slots"]} == {
        "main-0": "ready",
        "main-1": "backoff",
    }


def test_a_change_of_state_made_by_a_stop_reaches_the_router_in_the_same_turn(rig):
    rig.start()
    rig.step(signal.SIGTERM)
    rig.exit("router", 0)
    rig.step()  # the workers told to stop: draining, not through a timer's table
    slots = {s["name"]: s["state"] for s in rig.router.tables[-1]["slots"]}
    assert slots == {"main-0": "draining", "main-1": "draining"}


def test_a_restarted_router_is_ready_only_once_it_answers_itself(rig):
    rig.start()
    rig.step(seconds=rig.crash("router"))  # restarted after its backoff
    assert (
        rig.sup.roster.routers[0].state.value == "starting"
    )  # answers to the old one's tables are stale
    rig.step()
    assert rig.sup.roster.routers[0].state.value == "ready"


# -- what /metrics and the probes see ----------------------------------------------------------


def test_each_turn_publishes_a_snapshot_of_every_process(rig):
    rig.start()
    snap = rig.monitor.latest
    assert snap.taken == rig.os.now()
    assert [(p.name, p.kind, p.state) for p in snap.processes] == [
        ("router", "router", "ready"),
        ("main-0", "worker", "ready"),
        ("main-1", "worker", "ready"),
    ]
    assert snap.shards == (rig.sup.shards[0].status,) and snap.shard_age == (0.0,)
    assert snap.pools == (("default", "main"),) and not snap.stopping


def test_during_a_reload_each_slot_appears_once_as_the_instance_that_serves_it(rig):
    rig.start()
    old = rig.pid("main-0")
    rig.step(signal.SIGHUP)
    rig.router.quiet.add(rig.sup.replacement.pid)  # the replacement is still starting
    rig.step(seconds=0.1)
    workers = [p for p in rig.monitor.latest.processes if p.kind == "worker"]
    assert [(p.name, p.pid) for p in workers] == [
        ("main-0", old),
        ("main-1", rig.pid("main-1")),
    ]


def test_the_snapshot_says_stopping_from_sigterm_on(rig):
    rig.start()
    rig.step(signal.SIGTERM)
    assert rig.monitor.latest.stopping


TWO_MODELS = """
models:
  - {name: a, backend: torch, quantize: none, pools: [{name: main, max_tokens: 512, instances: 2}]}
  - {name: b, backend: torch, quantize: none, pools: [{name: main, max_tokens: 512, instances: 1}]}
supervisor: {start_timeout_s: 60, kill_timeout_s: 10}
server: {http: ""}
"""
# Two models with something to prepare (the fake OS runs no prepare: the tests write records).
TWO_PREPARED = TWO_MODELS.replace("torch", "onnxruntime").replace("instances: 2", "instances: 1")


def test_with_several_models_a_reload_restarts_only_the_changed_models_instances(tmp_path):
    rig = Rig(tmp_path, config_text=TWO_MODELS)
    rig.start()
    before = {name: rig.pid(name) for name in ("a.main-0", "a.main-1", "b.main-0")}
    rig.config_path.write_text(TWO_MODELS.replace("name: b,", "name: b, max_length: 128,"))

    rig.step(signal.SIGHUP)
    assert rig.sup.replacement.name == "b.main-0"
    assert rig.sup.wanted.renew == ("b.main-0",)  # not a's
    rig.step(seconds=0.3)  # b's replacement is heard
    rig.step()
    rig.os.exit(before["b.main-0"], 0)
    rig.run_for(1.0)

    assert rig.sup.wanted is None
    assert rig.pid("b.main-0") != before["b.main-0"]
    assert {name: rig.pid(name) for name in ("a.main-0", "a.main-1")} == {
        name: before[name] for name in ("a.main-0", "a.main-1")
    }
    assert rig.os.signals_to("a.main-0") == rig.os.signals_to("a.main-1") == []


THREE_MODELS = TWO_MODELS.replace(
    "supervisor:",
    "  - {name: c, backend: torch, quantize: none, pools: [{name: main, max_tokens: 512, instances: 1}]}\n"
    "supervisor:",
)


def test_a_reload_that_adds_a_model_starts_its_shard_and_instances_and_tells_the_frontend(
    tmp_path,
):
    rig = Rig(tmp_path, config_text=TWO_MODELS)
    rig.start()
    kept = {name: rig.pid(name) for name in ("a.main-0", "a.main-1", "b.main-0")}
    rig.config_path.write_text(THREE_MODELS)

    rig.step(signal.SIGHUP)
    assert rig.os.signals_to("frontend") == [signal.SIGHUP]
    routes = spec_of(rig.sup.roster.frontend.argv)["routes"]
    assert [r["model"] for r in routes] == ["a", "b", "c"]
    with open(spec_of(rig.sup.roster.frontend.argv)["routes_file"]) as f:
        assert json.load(f)["routes"] == routes  # what the frontend reads on SIGHUP
    assert rig.os.pid_of("router-2") is not None  # c's shard: a number no shard had
    assert rig.sup.roster.workers["c.main-0"].state.value == "starting"
    rig.step(seconds=0.3)
    rig.run_for(1.0)

    assert rig.sup.wanted is None
    assert rig.states()["c.main-0"] == "ready"
    assert {name: rig.pid(name) for name in kept} == kept
    assert not any(rig.os.signals_to(name) for name in kept)
    cpus = [c.binding.cpus.ids for c in rig.sup.roster.workers.values()]
    assert sum(map(len, cpus)) == len(set().union(*cpus))  # no CPU in two instances


def test_a_reload_that_removes_a_model_drains_its_shard_then_stops_its_instances(tmp_path):
    rig = Rig(tmp_path, config_text=THREE_MODELS)
    rig.start()
    b_shard, b_worker = rig.os.pid_of("router-1"), rig.pid("b.main-0")
    b_cpus = rig.sup.roster.workers["b.main-0"].binding
    rig.config_path.write_text(THREE_MODELS.replace("name: b,", "name: d,"))

    rig.step(signal.SIGHUP)
    assert rig.os.signals_to("router-1") == [signal.SIGTERM]
    assert rig.os.signals_to("b.main-0") == []  # it finishes what its shard sent it
    assert rig.os.pid_of("router-3") is None  # d waits for b's cores
    rig.os.exit(b_shard, 0)
    rig.step()
    assert rig.os.signals_to("b.main-0") == [signal.SIGTERM]
    assert rig.os.signals_to("frontend") == []  # b's replies may still be on their way
    rig.os.exit(b_worker, 0)
    rig.step()
    assert rig.os.signals_to("frontend") == [signal.SIGHUP]
    assert [r["model"] for r in spec_of(rig.sup.roster.frontend.argv)["routes"]] == ["a", "d", "c"]
    assert rig.sup.roster.workers["d.main-0"].binding == b_cpus  # b's core, free again
    rig.step(seconds=0.3)
    rig.run_for(1.0)

    assert rig.sup.wanted is None
    assert sorted(rig.sup.roster.workers) == ["a.main-0", "a.main-1", "c.main-0", "d.main-0"]
    assert [v.child.name for v in rig.sup.shards] == ["router-0", "router-2", "router-3"]


def test_a_reload_that_adds_and_changes_models_rolls_the_changed_once_the_added_are_up(tmp_path):
    rig = Rig(tmp_path, config_text=TWO_MODELS)
    rig.start()
    b = rig.pid("b.main-0")
    rig.config_path.write_text(THREE_MODELS.replace("name: a,", "name: a, max_length: 128,"))

    rig.step(signal.SIGHUP)
    rig.shards[-1].quiet.add("c.main-0")  # c is still loading its model
    rig.run_for(1.0)
    assert rig.sup.replacement is None  # a waits
    rig.shards[-1].quiet.clear()
    for name in ("a.main-0", "a.main-1"):
        old = rig.pid(name)
        rig.run_for(0.5)
        rig.os.exit(old, 0)
    rig.run_for(1.0)

    assert rig.sup.wanted is None
    assert rig.pid("b.main-0") == b and rig.os.signals_to("b.main-0") == []
    assert len(rig.os.signals_to("a.main-0")) == len(rig.os.signals_to("a.main-1")) == 1


def test_a_reload_whose_added_model_does_not_fit_keeps_the_running_config(tmp_path, caplog):
    rig = Rig(tmp_path, config_text=TWO_MODELS)
    rig.start()
    rig.config_path.write_text(
        THREE_MODELS.replace("instances: 1}]}\nsuper", "instances: 9}]}\nsuper")
    )

    rig.step(signal.SIGHUP)

    assert rig.sup.wanted is None
    assert "reload failed, keeping the running config: the added model(s) c do not fit" in (
        caplog.text
    )
    assert rig.os.signals_to("frontend") == []


def test_a_reload_that_would_move_a_kept_models_instances_is_refused(tmp_path, caplog):
    rig = Rig(tmp_path, config_text=TWO_MODELS)
    rig.start()
    rig.config_path.write_text(TWO_MODELS.replace("instances: 2", "instances: 3"))

    rig.step(signal.SIGHUP)

    assert rig.sup.wanted is None
    assert "model 'a': its pools' names, instances" in caplog.text


# -- the states' table and the server's mood -----------------------------------------------------


def test_a_state_change_outside_the_table_is_refused_as_a_bug():
    child = Child("main-0", ["worker"])
    child.change_state(State.STARTING, now=1.0)
    child.change_state(State.DRAINING, now=2.0)
    with pytest.raises(TransitionError, match="main-0: draining -> ready"):
        child.change_state(State.READY, now=3.0)
    assert child.state is State.DRAINING


def test_ready_notes_when_for_stable_s():
    child = Child("main-0", ["worker"])
    child.change_state(State.STARTING, now=1.0)
    child.change_state(State.READY, now=2.5)
    assert child.ready_at == 2.5


def test_the_server_mood_follows_prepare_start_reload_and_stop(tmp_path):
    rig = Rig(tmp_path, backend="onnxruntime")
    rig.sup.begin()
    assert rig.sup.mood is Mood.PREPARING
    assert rig.sup.summary().startswith("preparing the model: ")
    rig.os.exit(rig.sup.prepare.pid, 0)
    rig.step()
    assert rig.sup.mood is Mood.STARTING
    rig.step(seconds=0.1)
    rig.step(seconds=0.1)
    assert rig.sup.mood is Mood.SERVING and rig.notifier.kinds() == ["READY"]
    rig.step(signal.SIGHUP)  # the same model: nothing to prepare, every instance rolls
    assert rig.sup.mood is Mood.RELOADING
    assert rig.sup.summary().startswith("reloading: ")
    rig.run_for(2.0)
    assert rig.sup.wanted is None and rig.sup.mood is Mood.SERVING
    rig.step(signal.SIGTERM)
    assert rig.sup.mood is Mood.STOPPING and rig.sup.summary().startswith("stopping: ")


def test_an_aborted_reload_leaves_the_mood_it_found(rig):
    rig.start()
    rig.step(seconds=0.1)
    assert rig.sup.mood is Mood.SERVING
    rig.step(signal.SIGHUP)
    rig.os.exit(rig.sup.replacement.pid, exitcodes.MODEL)
    rig.step()
    assert rig.sup.wanted is None and rig.sup.mood is Mood.SERVING


def test_the_slot_table_carries_each_instances_live_affinity_so_no_shard_reads_proc(rig):
    rig.start()
    rig.step(seconds=0.3)
    slots = {s["name"]: s for s in rig.router.tables[-1]["slots"]}
    assert {name: s["live_cpus"] for name, s in slots.items()} == {
        name: s["cpus"] for name, s in slots.items()
    }
    rig.exit("main-0", 1)
    rig.step()
    slots = {s["name"]: s for s in rig.router.tables[-1]["slots"]}
    assert slots["main-0"]["live_cpus"] is None  # gone: nothing to read


CONFIG_WITH_TRACING = """
model: {path: bundled:minilm, backend: torch, quantize: none}
server: {http: "", tracing: {endpoint: "http://collector:4318"}}
placement: {pools: [{name: main, max_tokens: 512, instances: 1}]}
"""


def test_the_start_says_in_one_line_where_traces_go(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="numaserve.supervisor")
    rig = Rig(tmp_path, config_text=CONFIG_WITH_TRACING)
    rig.start()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("traces:")]
    assert line == (
        "traces: exported over OTLP (http/protobuf) to http://collector:4318, "
        "sampler parentbased_always_on"
    )
