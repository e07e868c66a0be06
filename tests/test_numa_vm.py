"""Placement, pinning and memory binding on a real 2-node kernel: the 2-socket SMT virtual
machine that `python -m tests.numa_vm` boots (2 sockets x 2 cores x 2 threads, node 0 = CPUs
0-3, node 1 = CPUs 4-7). Nothing here is faked: a real `numaserve start` runs in the guest,
and every check reads the guest kernel's own /proc. Skipped on a machine with one node.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from numaserve.client import Client
from numaserve.host.pinning import live_affinity, read_numa_maps
from numaserve.host.topology import read_topology
from tests.harness.checkpoints import LABELS
from tests.harness.console import numaserve
from tests.harness.server import ENDPOINT, Server

pytestmark = [
    pytest.mark.numa_vm,
    pytest.mark.skipif(
        len(read_topology().nodes) < 2, reason="needs 2 NUMA nodes: run python -m tests.numa_vm"
    ),
]
NODE_CPUS = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
# One 2-core instance per node (4 physical cores, SMT siblings left idle). Emulation is slow:
# torch takes minutes to import (the ONNX export imports it), hence the generous start
# timeout and heartbeat.
CONFIG = """
model: {{path: "{model}", task: classify, max_length: 64}}
server: {{endpoint: "{endpoint}", heartbeat_ms: 2000, heartbeat_liveness: 10}}
supervisor: {{start_timeout_s: 900}}
placement:
  reserved_cores: 0
  smt: false
  pools: [{{name: main, max_tokens: 64, cores_per_instance: 2, instances: auto}}]
"""


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


def test_requests_are_answered_by_instances_on_both_nodes(server, workers):
    with Client(server.endpoint, timeout=60) as client:
        results = [client.classify(f"text number {i}") for i in range(20)]
    assert all(r.label in LABELS for r in results)

    def both_served():  # `served` comes with the workers' heartbeats
        served = {i["name"]: i["served"] for i in server.status()["instances"]}
        return len(served) == 2 and all(n > 0 for n in served.values())

    server.wait_for(both_served, timeout=60, what="both instances to have served")
