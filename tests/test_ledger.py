"""The host-wide core ledger (numaserve/host/ledger.py): real files, real flocks, and real
processes standing in for other servers."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from numaserve.config.schema import PlacementConfig, PoolConfig
from numaserve.host import ledger as ledger_
from numaserve.host.cpuset import CPUSet
from numaserve.host.ledger import (
    CoresHeldError,
    Holder,
    Ledger,
    held_cpus,
    ledger_dir,
    plan_around,
)
from numaserve.host.placement import PlacementError, plan_placement
from numaserve.host.topology import read_topology
from tests.harness.fake_system import Rig
from tests.test_supervisor_states import THREE_MODELS, TWO_MODELS

# Another server: registers `cpus` in the ledger at argv[1], says so, and lives on until killed.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from numaserve.host.cpuset import CPUSet
    from numaserve.host.ledger import Ledger
    ledger = Ledger(Path(sys.argv[1]))
    with ledger.locked():
        ledger.register(sys.argv[2], CPUSet.parse(sys.argv[3]))
    print("registered", flush=True)
    time.sleep(600)
    """
)
AUTO_POOL = PlacementConfig(pools=(PoolConfig(name="main", max_tokens=128),))


@pytest.fixture
def holders_started(tmp_path):
    """Start other servers' stand-ins; each is killed at the end."""
    procs = []

    def start(cpus, config="/etc/numaserve/other.yaml"):
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path), config, ",".join(map(str, cpus))],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "registered"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_live_servers_entry_is_seen_by_another(tmp_path, holders_started):
    other = holders_started([0, 1, 40, 41], "/etc/numaserve/a.yaml")

    assert Ledger(tmp_path).holders() == [
        Holder(other.pid, "/etc/numaserve/a.yaml", CPUSet.of([0, 1, 40, 41]))
    ]


def test_a_killed_servers_entry_is_removed_by_the_next_reader(tmp_path, holders_started):
    other = holders_started([0, 1])
    other.send_signal(signal.SIGKILL)
    other.wait()

    assert Ledger(tmp_path).holders() == []
    assert not list(tmp_path.glob("server-*.json"))


def test_a_released_entry_is_gone(tmp_path):
    ledger = Ledger(tmp_path)
    entry = ledger.register("/etc/numaserve/a.yaml", CPUSet.of([0, 1]))
    assert entry.exists()

    ledger.release()

    assert not entry.exists()


def test_a_server_is_not_its_own_holder(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.register("/etc/numaserve/a.yaml", CPUSet.of([0, 1]))

    assert ledger.holders() == []
    ledger.release()


def test_a_second_registration_waits_for_the_first_to_plan(tmp_path):
    """Read, plan and register are one step: a server starting meanwhile waits its turn."""
    ledger = Ledger(tmp_path)
    with ledger.locked():
        waiting = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path), "/b.yaml", "2"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)
        registered_meanwhile = list(tmp_path.glob("server-*.json"))
    try:
        assert not registered_meanwhile, "it registered inside our turn"
        assert waiting.stdout.readline().strip() == "registered"
    finally:
        waiting.kill()
        waiting.wait()


def test_held_cpus_are_whole_cores_with_their_idle_siblings(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    plan = plan_placement(
        topo,
        PlacementConfig(reserved_cores=1, smt=False, pools=(PoolConfig("main", 128, instances=2),)),
    )
    core_of = {cpu: core for core in topo.cores for cpu in core.cpus}
    used = {*plan.reserved_cpus, *(cpu for s in plan.slots for cpu in s.cpus)}

    held = set(held_cpus(plan, topo))

    assert held == {cpu for c in used for cpu in core_of[c].cpus}
    siblings = {core_of[cpu].cpus[1] for slot in plan.slots for cpu in slot.cpus}
    assert siblings.isdisjoint(used) and siblings <= held  # idle with smt: false, yet held


def test_a_second_server_plans_around_the_cores_another_holds(tmp_path, sysfs, holders_started):
    topo = read_topology(sysfs("xeon8260_2socket"))
    node0 = {cpu for core in topo.cores_in_node(0) for cpu in core.cpus}
    holders_started(sorted(node0))

    free, plan, holders = plan_around(Ledger(tmp_path), topo, AUTO_POOL)

    assert len(holders) == 1
    assert plan.slots and all(slot.node == 1 for slot in plan.slots)
    assert not free.allowed_cpus & CPUSet(node0)
    assert len(plan.slots) == len(topo.cores_in_node(1))  # auto takes all that is left


def test_a_server_that_does_not_fit_names_the_holder(tmp_path, sysfs, holders_started):
    topo = read_topology(sysfs("xeon8260_2socket"))
    other = holders_started(sorted(topo.allowed_cpus), "/etc/numaserve/toxicity.yaml")

    with pytest.raises(CoresHeldError) as caught:
        plan_around(Ledger(tmp_path), topo, AUTO_POOL)

    message = str(caught.value)
    assert f"pid {other.pid} (config /etc/numaserve/toxicity.yaml)" in message
    assert str(tmp_path) in message


def test_a_server_that_could_never_fit_gets_the_plain_error(tmp_path, sysfs, holders_started):
    topo = read_topology(sysfs("xeon8260_2socket"))
    holders_started([0])
    too_many = PlacementConfig(pools=(PoolConfig("main", 128, instances=len(topo.cores) + 1),))

    with pytest.raises(PlacementError) as caught:
        plan_around(Ledger(tmp_path), topo, too_many)

    assert not isinstance(caught.value, CoresHeldError)
    assert "48 allowed physical core(s)" in str(caught.value)


def test_no_holders_no_change_to_the_plan(tmp_path, sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))

    free, plan, holders = plan_around(Ledger(tmp_path), topo, AUTO_POOL)

    assert holders == [] and free == topo
    assert plan == plan_placement(topo, AUTO_POOL)


def test_the_ledger_directory_is_the_environments_when_set(tmp_path):
    chosen = tmp_path / "ledger"

    assert ledger_dir({"NUMASERVE_LEDGER": str(chosen)}) == chosen
    assert chosen.is_dir()


def test_the_ledger_directory_is_run_numaserve_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_, "SYSTEM_DIR", tmp_path / "numaserve")

    assert ledger_dir({"XDG_RUNTIME_DIR": "/nonexistent"}) == tmp_path / "numaserve"


def test_the_ledger_directory_falls_back_to_xdg_runtime_dir(tmp_path, monkeypatch):
    (tmp_path / "run").write_text("")  # /run/numaserve cannot be made, even by root
    monkeypatch.setattr(ledger_, "SYSTEM_DIR", tmp_path / "run" / "numaserve")
    xdg = tmp_path / "user"
    xdg.mkdir()

    assert ledger_dir({"XDG_RUNTIME_DIR": str(xdg)}) == xdg / "numaserve"


def test_no_ledger_directory_at_all_is_none(tmp_path, monkeypatch):
    (tmp_path / "run").write_text("")
    monkeypatch.setattr(ledger_, "SYSTEM_DIR", tmp_path / "run" / "numaserve")

    assert ledger_dir({}) is None


def test_a_command_that_only_reads_creates_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_, "SYSTEM_DIR", tmp_path / "numaserve")

    assert ledger_dir({}, create=False) is None
    assert not (tmp_path / "numaserve").exists()
    assert os.listdir(tmp_path) == []


def run_cli(ledger, *args):
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    env = {**os.environ, "NUMASERVE_LEDGER": str(ledger)}
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=60)


def test_topology_shows_the_cpus_other_servers_hold(tmp_path, holders_started):
    other = holders_started([1], "/etc/numaserve/toxicity.yaml")

    table = run_cli(tmp_path, "topology").stdout
    data = json.loads(run_cli(tmp_path, "topology", "--json").stdout)

    line = (
        f"held by another numaserve server: pid {other.pid} (config /etc/numaserve/toxicity.yaml)"
    )
    assert f"{line} holds CPUs 1" in table
    assert data["held"] == [
        {
            "pid": other.pid,
            "config": "/etc/numaserve/toxicity.yaml",
            "cpus": [1],
            "endpoint": "",  # none recorded by this stand-in holder
            "control": "",
        }
    ]


def test_plan_on_this_machine_plans_around_other_servers(tmp_path, holders_started):
    holders_started([1])
    config = tmp_path / "one.yaml"
    config.write_text("placement: {pools: [{name: main, max_tokens: 512}]}")

    data = json.loads(run_cli(tmp_path, "plan", "--config", config, "--json").stdout)

    assert 1 not in {cpu for i in data["instances"] for cpu in i["cpus"]}
    assert [h["cpus"] for h in data["held"]] == [[1]]


def test_plan_of_a_config_being_served_shows_its_plan_and_who_serves_it(tmp_path, holders_started):
    config = tmp_path / "one.yaml"
    config.write_text("placement: {pools: [{name: main, max_tokens: 512}]}")
    serving = holders_started([0, 1], str(config))  # every CPU of this 2-CPU machine

    out = run_cli(tmp_path, "plan", "--config", config)

    assert out.returncode == 0, out.stderr
    assert f"served now by pid {serving.pid}" in out.stdout
    assert "main-0" in out.stdout


def test_a_second_start_of_a_config_being_served_says_so(tmp_path, holders_started):
    config = tmp_path / "one.yaml"
    config.write_text('server: {endpoint: "tcp://127.0.0.1:5999"}\n')
    serving = holders_started([0], str(config))

    out = run_cli(tmp_path, "start", "--config", config)

    assert out.returncode == 75, out.stderr
    assert f"served already, by pid {serving.pid} on tcp://127.0.0.1:5999" in out.stderr
    assert "numaserve stop --endpoint tcp://127.0.0.1:5999" in out.stderr
    assert "fewer instances" not in out.stderr


def test_a_reload_that_adds_a_model_plans_around_servers_started_since_and_holds_its_cores(
    tmp_path, holders_started
):
    """The supervisor on a FAKE OS (tests/harness/fake_system.py), with this real ledger: a
    server that started after ours holds CPU 3; our entry follows the models we serve."""
    ledger = Ledger(tmp_path)
    rig = Rig(tmp_path, config_text=TWO_MODELS, ledger=ledger)
    ledger.register(str(rig.config_path), held_cpus(rig.sup.plan, rig.sup.topo))
    rig.start()
    holders_started([3])

    def ours() -> list[int]:
        return json.loads((tmp_path / f"server-{os.getpid()}.json").read_text())["cpus"]

    assert ours() == [0, 1, 2]
    rig.config_path.write_text(THREE_MODELS)
    rig.step(signal.SIGHUP)
    rig.step(seconds=0.3)
    rig.run_for(1.0)
    assert rig.sup.wanted is None
    assert rig.sup.roster.workers["c.main-0"].binding.cpus == CPUSet.of(
        [4]
    )  # not CPU 3, the other server's
    assert ours() == [0, 1, 2, 4]

    b_worker = rig.pid("b.main-0")
    rig.config_path.write_text(
        "\n".join(line for line in THREE_MODELS.splitlines() if "name: b," not in line)
    )
    rig.step(signal.SIGHUP)
    rig.os.exit(rig.os.pid_of("router-1"), 0)
    rig.step()
    rig.os.exit(b_worker, 0)
    rig.run_for(1.0)
    assert rig.sup.wanted is None
    assert ours() == [0, 1, 4]  # b's core is free for other servers again
    ledger.release()


def test_a_reload_aborted_before_its_models_were_added_gives_their_cores_back(tmp_path):
    """As above, on a FAKE OS: the added model's artifact cannot be built."""
    ledger = Ledger(tmp_path)
    rig = Rig(tmp_path, config_text=TWO_MODELS, ledger=ledger)
    ledger.register(str(rig.config_path), held_cpus(rig.sup.plan, rig.sup.topo))
    rig.start()
    rig.config_path.write_text(THREE_MODELS.replace("name: c, backend: torch", "name: c"))

    rig.step(signal.SIGHUP)
    entry = tmp_path / f"server-{os.getpid()}.json"
    assert json.loads(entry.read_text())["cpus"] == [0, 1, 2, 3]  # held while it prepares
    rig.os.exit(rig.os.pid_of("prepare"), 1)
    rig.step()

    assert rig.sup.wanted is None
    assert json.loads(entry.read_text())["cpus"] == [0, 1, 2]
    assert "c.main-0" not in rig.sup.roster.workers
    ledger.release()
