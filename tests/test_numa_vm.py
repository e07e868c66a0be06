"""Placement, pinning and memory binding on a real 2-node kernel: the 2-socket SMT virtual
machine that `python -m tests.numa_vm` boots (2 sockets x 2 cores x 2 threads, node 0 = CPUs
0-3, node 1 = CPUs 4-7). Nothing here is faked: a real `numaserve start` runs in the guest,
and every check reads the guest kernel's own /proc. Skipped on a machine with one node.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numaserve.client import Client
from numaserve.host.pinning import live_affinity, read_numa_maps
from numaserve.host.topology import read_topology
from tests.harness.checkpoints import LABELS
from tests.harness.console import numaserve
from tests.harness.seccomp import UNDER_DEFAULT_PROFILE
from tests.harness.server import ENDPOINT, Server
from tests.harness.vm_server import CONFIG

pytestmark = [
    pytest.mark.numa_vm,
    pytest.mark.skipif(
        len(read_topology().nodes) < 2, reason="needs 2 NUMA nodes: run python -m tests.numa_vm"
    ),
]
NODE_CPUS = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}


@pytest.fixture(scope="module", autouse=True)
def artifacts_built_before_the_boot():
    """The servers here load the artifacts the host built for the guest's CPU model
    (tests/numa_vm.py: ensure_artifacts), copied into the run's new cache (tests/conftest.py),
    where the guest's prepare adds their packed forms (packed on the guest's own CPU) and its
    instances their nodes' copies: a build under emulation spends over 6 minutes importing
    torch and exporting."""
    artifacts = os.environ.get("NUMASERVE_VM_ARTIFACTS")
    if not artifacts:
        pytest.fail(
            "NUMASERVE_VM_ARTIFACTS is not set: run these tests through python -m tests.numa_vm"
        )
    run_cache = os.environ["NUMASERVE_CACHE"]
    shutil.copytree(artifacts, run_cache, dirs_exist_ok=True)
    yield run_cache


@pytest.fixture(scope="module")
def config_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "numa.yaml"
    model = os.environ.get("NUMASERVE_VM_MODEL")
    if not model:
        pytest.fail(
            "NUMASERVE_VM_MODEL is not set: run these tests through python -m tests.numa_vm"
        )
    path.write_text(CONFIG.format(model=model, endpoint="tcp://127.0.0.1:5555"))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, config_path):
    config = config_path.read_text().replace("tcp://127.0.0.1:5555", ENDPOINT)
    s = Server(tmp_path_factory.mktemp("server"), config)
    try:
        s.wait_ready(timeout=1200)
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def workers(server) -> list[dict]:
    return server.status()["instances"]


@pytest.fixture(scope="module")
def shards(server) -> list[dict]:
    """The router shards as the status op shows them, each with its pid."""
    return [{**s, "pid": server.shard_pid(s["shard"])} for s in server.status()["shards"]]


def node_holding(cpus) -> int:
    (node,) = [n for n, node_cpus in NODE_CPUS.items() if set(cpus) <= node_cpus]
    return node


def cli_json(*args: str) -> dict:
    out = numaserve(*args, "--json", timeout=120)  # emulation: imports are slow
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_topology_sees_two_sockets_two_nodes_and_smt_siblings():
    topo = cli_json("topology")
    assert topo["sockets"] == 2
    assert {n["id"]: set(n["cpus"]) for n in topo["nodes"]} == NODE_CPUS
    assert len(topo["cores"]) == 4
    for core in topo["cores"]:
        assert len(core["cpus"]) == 2, core  # two SMT threads per core
        assert set(core["cpus"]) <= NODE_CPUS[core["node"]]


def test_plan_keeps_each_slot_in_one_node_with_one_thread_per_core(config_path):
    plan = cli_json("plan", "--config", str(config_path))
    slots = plan["instances"]
    assert sorted(s["node"] for s in slots) == [0, 1]
    cores = {tuple(c["cpus"]) for c in cli_json("topology")["cores"]}
    for slot in slots:
        assert set(slot["cpus"]) <= NODE_CPUS[slot["node"]] and slot["nodes"] == [slot["node"]]
        used = [c for c in cores if set(c) & set(slot["cpus"])]
        assert len(used) == len(slot["cpus"]) == slot["threads"]  # one CPU of each core


def test_plan_puts_a_router_shard_on_each_nodes_reserved_core(config_path):
    plan = cli_json("plan", "--config", str(config_path))
    routers = plan["routers"]
    assert [node_holding(r["cpus"]) for r in routers] == [r["node"] for r in routers] == [0, 1]
    assert not {c for r in routers for c in r["cpus"]} & {
        c for i in plan["instances"] for c in i["cpus"]
    }


def test_the_server_loads_the_artifact_built_before_the_boot(
    server, artifacts_built_before_the_boot
):
    log = server.log()
    assert "building the ONNX artifact" not in log, log
    assert f"artifact {artifacts_built_before_the_boot}/onnx/" in log, log
    # The named int8's cost, judged before the boot too: read, not judged again (torch)
    assert "onnxruntime int8, pool " in log and "judging it against fp32" not in log, log


def test_each_router_shard_runs_and_keeps_its_memory_on_its_own_node(shards, workers):
    assert sorted(node_holding(s["cpus"]) for s in shards) == [0, 1]
    for s in shards:
        node = node_holding(s["cpus"])
        for task in Path(f"/proc/{s['pid']}/task").iterdir():
            assert live_affinity(f"{s['pid']}/task/{task.name}") == tuple(s["cpus"]), s
        maps = read_numa_maps(s["pid"])
        assert f"bind:{node}" in maps.policies and maps.policies <= {f"bind:{node}", "local"}
        assert set(maps.anon_pages_per_node) == {node}, (s["shard"], maps.anon_pages_per_node)
        # and it routes to the instance on its own node, and to no other
        mine = [w for w in workers if w["shard"] == s["shard"]]
        assert [w["nodes"] for w in mine] == [[node]], (s, workers)


def test_every_thread_of_each_worker_runs_on_its_slots_cpus(workers):
    for w in workers:
        tasks = list(Path(f"/proc/{w['pid']}/task").iterdir())
        assert len(tasks) > 1
        for task in tasks:
            assert live_affinity(f"{w['pid']}/task/{task.name}") == tuple(w["cpus"]), w


def test_each_workers_memory_policy_is_bound_to_its_node(workers):
    assert sorted(w["nodes"] for w in workers) == [[0], [1]]
    for w in workers:
        (node,) = w["nodes"]
        policies = read_numa_maps(w["pid"]).policies
        # A native library may mbind() an arena MPOL_LOCAL itself: with the CPUs pinned to the
        # node, "local" is the same node.
        assert f"bind:{node}" in policies and policies <= {f"bind:{node}", "local"}, (w, policies)


def test_each_workers_own_pages_sit_on_its_node(workers):
    for w in workers:
        (node,) = w["nodes"]
        anon = read_numa_maps(w["pid"]).anon_pages_per_node
        assert sum(anon.values()) > 1000, anon  # the model and the runtime's heap, not a few pages
        assert set(anon) == {node}, f"{w['name']} on node {node} has pages on {anon}"


def test_each_nodes_instances_map_that_nodes_copy_of_the_weights_with_its_pages_there(workers):
    for w in workers:
        (node,) = w["nodes"]
        (weights,) = w["weights"]
        assert weights["node"] == node and f"/node{node}/" in weights["file"], w
        pages = read_numa_maps(w["pid"], weights["file"]).pages_per_node
        assert sum(pages.values()) > 0 and set(pages) == {node}, (w["name"], pages)


def test_requests_are_answered_by_instances_on_both_nodes(server, workers):
    with Client(server.endpoint, timeout=60) as client:
        results = [client.classify(f"text number {i}") for i in range(20)]
    assert all(r.label in LABELS for r in results)

    def both_served():  # `served` comes with the workers' heartbeats
        served = {i["name"]: i["served"] for i in server.status()["instances"]}
        return len(served) == 2 and all(n > 0 for n in served.values())

    server.wait_for(both_served, timeout=60, what="both instances to have served")
    # the frontend handed requests to both shards
    assert all(s["requests"]["replies_ok"] > 0 for s in server.status()["shards"])


def cpuset_allowing_memory_of(node: int, tmp_path: Path) -> Path:
    """A real cpuset cgroup of the guest whose memory nodes are `node` only: its procs file."""
    mount = tmp_path / "cgroup"
    mount.mkdir()
    procs = mount_cpuset_hierarchy(mount)
    group = mount / "numaserve-test"
    group.mkdir(exist_ok=True)
    (group / "cpuset.cpus").write_text("0-7")
    (group / "cpuset.mems").write_text(str(node))
    return group / procs


def mount_cpuset_hierarchy(mount: Path) -> str:
    """Mount cgroup v2 at `mount` where its cpuset controller is free, else the v1 cpuset
    hierarchy; the name of the file a process joins a group by."""
    if subprocess.run(["mount", "-t", "cgroup2", "none", str(mount)]).returncode == 0:
        if "cpuset" in (mount / "cgroup.controllers").read_text().split():
            (mount / "cgroup.subtree_control").write_text("+cpuset")
            return "cgroup.procs"
        subprocess.run(["umount", str(mount)], check=True)
    subprocess.run(["mount", "-t", "cgroup", "-o", "cpuset", "none", str(mount)], check=True)
    return "tasks"


def test_a_planner_whose_cpuset_allows_node_1s_memory_only_places_on_node_1(tmp_path):
    config = tmp_path / "one-node.yaml"
    config.write_text(
        "placement: {pools: [{name: main, max_tokens: 512, cores_per_instance: 1}]}\n"
    )
    procs = cpuset_allowing_memory_of(1, tmp_path)
    exe = Path(sys.executable).with_name("numaserve")
    script = f"echo $$ > {procs} && exec {exe} plan --config {config} --json"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert {i["node"] for i in plan["instances"]} == {1}
    assert len(plan["instances"]) == 2  # node 1's two cores
    assert "node 0's memory is not allowed to this process" in out.stderr


CAPTURE = dict(capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1])
PIN = (
    "from numaserve.host.pinning import PinningError, pin_current_process\n"
    "try:\n    print(pin_current_process({cpus}, {nodes})[0])\n"
    "except PinningError as e:\n    print(e)\n"
)


def test_under_the_default_profile_a_cpuset_wider_than_the_slot_is_refused_naming_both_remedies():
    """As a pod under `seccompProfile: RuntimeDefault` without CAP_SYS_NICE on a host whose
    cpuset.mems spans both nodes: the slot's memory could land on the other node."""
    code = PIN.format(cpus=[0], nodes=[0])
    out = subprocess.run([*UNDER_DEFAULT_PROFILE, sys.executable, "-c", code], **CAPTURE)
    assert "cpuset.mems allows node(s) 0-1, not the slot's 0 alone" in out.stdout, out
    assert "single-numa-node" in out.stdout and "CAP_SYS_NICE" in out.stdout


def test_under_the_default_profile_a_cpuset_of_the_slots_node_alone_binds_it(tmp_path):
    procs = cpuset_allowing_memory_of(1, tmp_path)
    code = PIN.format(cpus=[4], nodes=[1])
    pin = shlex.join([*UNDER_DEFAULT_PROFILE, sys.executable, "-c", code])
    out = subprocess.run(["sh", "-c", f"echo $$ > {procs} && exec {pin}"], **CAPTURE)
    assert out.stdout.strip() == "cpuset", out
