"""Topology read from sysfs fixture trees named after real machines, and from this machine."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numaserve.config.schema import PlacementConfig
from numaserve.host.cpulist import parse_cpulist
from numaserve.host.cpuset import CPUSet
from numaserve.host.isa import INTERESTING_ISA
from numaserve.host.placement import plan_placement
from numaserve.host.topology import (
    TopologyError,
    _mems_allowed,
    cores_from_lscpu,
    read_topology,
)
from tests.harness.sysfs_machines import FIXTURES, NAMED, Cpu, Machine


def core_of(topo, cpu):
    return next(c for c in topo.cores if cpu in c.cpus)


def test_2socket_xeon_pairs_each_cpu_with_its_sibling_48_apart(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    assert topo.sockets == (0, 1)
    assert len(topo.cores) == 48
    assert [n.cpus for n in topo.nodes] == [
        (*range(0, 24), *range(48, 72)),
        (*range(24, 48), *range(72, 96)),
    ]
    assert core_of(topo, 5).cpus == (5, 53)
    assert core_of(topo, 30) == core_of(topo, 78)


def test_core_id_repeating_across_packages_does_not_merge_cores(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    # CPU 0 (package 0) and CPU 24 (package 1) both have core_id 0.
    assert core_of(topo, 0).cpus == (0, 48)
    assert core_of(topo, 24).cpus == (24, 72)


def test_epyc_nps4_has_four_nodes_per_socket_of_six_cores(sysfs):
    topo = read_topology(sysfs("epyc7402_2socket_nps4"))
    assert len(topo.nodes) == 8
    assert [len(topo.cores_in_node(n.id)) for n in topo.nodes] == [6] * 8
    assert {c.socket for c in topo.cores_in_node(5)} == {1}
    assert topo.nodes[1].cpus == (*range(6, 12), *range(54, 60))


def test_uneven_sub_numa_clusters_keep_their_sizes(sysfs):
    topo = read_topology(sysfs("xeon6980p_snc3"))
    assert [len(topo.cores_in_node(n.id)) for n in topo.nodes] == [43, 43, 42]
    assert [n.memory_mb for n in topo.nodes] == [262144, 262144, 253952]


def test_smt_disabled_at_boot_leaves_one_thread_per_core(sysfs):
    topo = read_topology(sysfs("xeon_e2288g_smt_off"))
    assert not topo.smt
    assert [c.cpus for c in topo.cores] == [(i,) for i in range(8)]


def test_offline_cpus_are_left_out_and_memory_only_node_is_kept(sysfs):
    topo = read_topology(sysfs("xeon8380_cxl_offline"))
    online = set(topo.online_cpus)
    assert not online & {38, 39, 78, 79, 50}
    assert len(topo.cores) == 38
    assert core_of(topo, 10).cpus == (10,)  # its sibling 50 is offline
    cxl = topo.nodes[1]
    assert (cxl.cpus, cxl.memory_mb) == ((), 131072)
    assert topo.to_json()["nodes"][1] == {"id": 1, "cpus": [], "memory_mb": 131072}


def test_cpus_numbered_alternately_across_sockets(sysfs):
    topo = read_topology(sysfs("xeon_e5_2690v4_interleaved"))
    assert topo.nodes[0].cpus == tuple(range(0, 56, 2))
    assert core_of(topo, 1).cpus == (1, 29)
    assert {c.socket for c in topo.cores_in_node(1)} == {1}


def test_missing_online_file_falls_back_to_each_cpus_flag(sysfs, tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(sysfs("xeon8380_cxl_offline"), root)
    (root / "devices/system/cpu/online").unlink()
    topo = read_topology(root)
    assert topo.online_cpus == read_topology(sysfs("xeon8380_cxl_offline")).online_cpus


def test_incomplete_sysfs_uses_lscpu_output(sysfs, tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(sysfs("xeon_e5_2690v4_interleaved"), root)
    for cpu in (3, 7):
        shutil.rmtree(root / f"devices/system/cpu/cpu{cpu}/topology")
    reference = read_topology(sysfs("xeon_e5_2690v4_interleaved"))
    lscpu = "# CPU,Core,Socket,Node\n" + "".join(
        f"{cpu},{i},{core.socket},{core.node}\n"
        for i, core in enumerate(reference.cores)
        for cpu in core.cpus
    )
    topo = read_topology(root, lscpu_text=lscpu)
    assert topo.source == "lscpu"
    assert topo.cores == reference.cores


def test_incomplete_fixture_without_lscpu_output_is_a_clear_error(sysfs, tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(sysfs("epyc_kvm_2vcpu"), root)
    shutil.rmtree(root / "devices/system/cpu/cpu1/topology")
    with pytest.raises(TopologyError, match=r"CPUs 1 have no topology files \(cpuN/topology"):
        read_topology(root)


def test_a_directory_that_is_not_sysfs_is_a_clear_error(tmp_path):
    with pytest.raises(TopologyError, match=r"is .* a sysfs tree"):
        read_topology(tmp_path)


def test_a_captures_top_folder_is_a_clear_error_that_names_its_sys_folder(sysfs, tmp_path):
    shutil.copytree(sysfs("epyc_kvm_2vcpu"), tmp_path / "capture" / "sys")
    with pytest.raises(TopologyError, match=f"pass {tmp_path}/capture/sys "):
        read_topology(tmp_path / "capture")


def test_nodes_given_only_as_hex_masks_are_read(sysfs):
    topo = read_topology(sysfs("epyc7451_2socket_cpumap"))
    assert [len(topo.cores_in_node(n.id)) for n in topo.nodes] == [6] * 8
    assert topo.nodes[5].cpus == (*range(30, 36), *range(78, 84))
    assert topo.sockets == (0, 1)
    assert core_of(topo, 0).cpus == (0, 48)
    assert topo.warnings == ()


def test_a_trailing_nul_byte_in_cpu_set_files_is_tolerated(sysfs):
    topo = read_topology(sysfs("graviton2_nul"))
    assert [c.cpus for c in topo.cores] == [(i,) for i in range(64)]
    assert [n.cpus for n in topo.nodes] == [tuple(range(64))]


def test_online_cpus_that_no_node_lists_are_left_out_not_given_a_made_up_node(sysfs):
    topo = read_topology(sysfs("node0_offline"))
    assert [(n.id, n.cpus) for n in topo.nodes] == [(1, tuple(range(16, 32)))]
    assert {c.node for c in topo.cores} == {1}
    assert topo.allowed_cpus == CPUSet(range(16, 32))
    assert len(topo.warnings) == 1
    assert "online CPUs 0-15 are in no node's cpulist" in topo.warnings[0]


def test_firmware_giving_cpus_to_several_nodes_is_refused(sysfs):
    with pytest.raises(
        TopologyError, match=r"gives CPUs 0-15 to more than one NUMA node \(nodes 0-7"
    ):
        read_topology(sysfs("duplicated_nodes_firmware"))


def test_sockets_come_from_the_package_cpu_sets_where_package_id_is_minus_one(sysfs):
    topo = read_topology(sysfs("s390_z15_lpar"))
    assert topo.sockets == (0, 1)
    assert {c.socket for c in topo.cores if c.id < 8} == {0}
    assert len(topo.cores) == 8 and all(len(c.cpus) == 2 for c in topo.cores)


def test_a_package_id_that_contradicts_the_package_cpu_sets_yields_to_them(sysfs, tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(sysfs("xeon8260_2socket"), root)
    for f in root.glob("devices/system/cpu/cpu*/topology/physical_package_id"):
        f.write_text("0\n")  # a hypervisor that numbers every vCPU's package 0
    topo = read_topology(root)
    assert topo.sockets == (0, 1)
    assert {c.socket for c in topo.cores_in_node(1)} == {1}
    assert "physical_package_id contradicts the package CPU sets" in topo.warnings[0]


def test_intel_hybrid_cores_are_typed_from_the_cpu_core_and_cpu_atom_lists(sysfs):
    topo = read_topology(sysfs("i7_1370p_hybrid"))
    assert topo.core_types == ("performance", "efficiency")
    assert [(c.cpus, c.type) for c in topo.cores[:2]] == [
        ((0, 1), "performance"),
        ((2, 3), "performance"),
    ]
    assert [c.type for c in topo.cores].count("performance") == 6
    assert [c.cpus for c in topo.cores if c.type == "efficiency"] == [(i,) for i in range(12, 20)]


def test_arm_big_little_cores_are_typed_by_cpu_capacity(sysfs):
    topo = read_topology(sysfs("rk3588_big_little"))
    assert topo.core_types == ("performance", "efficiency")
    assert {c.id: c.type for c in topo.cores} == {
        **{i: "efficiency" for i in range(4)},
        **{i: "performance" for i in range(4, 8)},
    }


def test_a_uniform_machine_has_one_core_type(sysfs):
    assert read_topology(sysfs("xeon8260_2socket")).core_types == ("performance",)


def test_nodes_whose_memory_is_not_allowed_leave_their_cpus_out(sysfs):
    # A pod whose cpuset allows node 1's memory only: node 0's instances could not bind.
    topo = read_topology(sysfs("xeon8260_2socket"), allowed_mems=[1])
    assert topo.allowed_cpus == CPUSet(topo.nodes[1].cpus)
    assert topo.warnings == (
        "node 0's memory is not allowed to this process (allowed memory nodes: 1; "
        "cpuset.mems): its CPUs 0-23,48-71 are left out",
    )


def test_this_process_memory_nodes_are_read_from_proc_self_status():
    status = Path("/proc/self/status").read_text()
    line = next(ln for ln in status.splitlines() if ln.startswith("Mems_allowed_list:"))
    assert _mems_allowed() == parse_cpulist(line.split(":")[1])
    assert set(_mems_allowed()) >= {n.id for n in read_topology().nodes if n.cpus}


def test_allowed_cpus_restrict_what_is_placeable(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"), allowed_cpus=range(24, 48))
    assert topo.allowed_cpus == CPUSet(range(24, 48))


def test_allowed_cpus_that_are_offline_are_left_out_with_a_warning(sysfs):
    # Common in containers: the cgroup's cpuset still names CPUs taken offline since.
    topo = read_topology(sysfs("xeon8380_cxl_offline"), allowed_cpus=[1, 38])
    assert topo.allowed_cpus == CPUSet([1])
    assert topo.warnings == (
        "allowed CPUs 38 are not online CPUs with a node (online: 0-37,40-49,51-77): left out",
    )


def test_this_machine_matches_lscpu_and_our_affinity():
    topo = read_topology()
    lscpu = subprocess.run(
        ["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, check=True
    ).stdout
    assert topo.cores == cores_from_lscpu(lscpu, topo.online_cpus)
    assert topo.allowed_cpus == CPUSet(os.sched_getaffinity(0))
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, arm
            flags |= set(value.split())
    assert topo.isa == tuple(f for f in INTERESTING_ISA if f in flags)


def test_the_captured_dev_machine_fixture_reads_like_the_machine(sysfs):
    topo = read_topology(sysfs("epyc_kvm_2vcpu"))
    assert [c.cpus for c in topo.cores] == [(0,), (1,)]
    assert topo.nodes[0].memory_mb > 0


@st.composite
def machines(draw):
    """Random machines: packages x cores x threads, numbered in one of the real schemes."""
    packages = draw(st.integers(1, 3))
    cores = draw(st.integers(1, 8))
    threads = draw(st.integers(1, 2))
    nodes_per_package = draw(st.integers(1, min(cores, 3)))
    scheme = draw(st.sampled_from(["thread-major", "interleaved", "core-major"]))
    core_ids = draw(st.lists(st.integers(0, 63), min_size=cores, max_size=cores, unique=True))
    cpus = []
    for p in range(packages):
        for i in range(cores):
            for t in range(threads):
                cpu_id = {
                    "thread-major": t * packages * cores + p * cores + i,
                    "interleaved": (t * cores + i) * packages + p,
                    "core-major": (p * cores + i) * threads + t,
                }[scheme]
                node = p * nodes_per_package + min(
                    i * nodes_per_package // cores, nodes_per_package - 1
                )
                cpus.append(Cpu(cpu_id, p, 0, core_ids[i], node))
    n_cpus = len(cpus)
    offline = (
        draw(st.sets(st.integers(1, n_cpus - 1), max_size=n_cpus // 3)) if n_cpus > 1 else set()
    )
    cpus = [
        Cpu(c.id, c.package, c.die, c.core_id, c.node, online=c.id not in offline) for c in cpus
    ]
    memory = {n: 1024 for n in range(packages * nodes_per_package)}
    if draw(st.booleans()):
        memory[len(memory)] = 4096  # a memory-only node
    form = draw(st.sampled_from(["lists", "masks", "both"]))
    return Machine(
        "random",
        cpus,
        memory,
        online_file=draw(st.booleans()),
        lists=form != "masks",
        masks=form != "lists",
        package_ids=draw(st.booleans()),
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(machine=machines())
def test_reader_recovers_every_random_machine(machine, tmp_path_factory):
    root = machine.write(tmp_path_factory.mktemp("sys"))
    topo = read_topology(root)
    assert sorted(c.cpus for c in topo.cores) == machine.expected_cores()
    node_of = {c.id: c.node for c in machine.cpus}
    assert all(node_of[cpu] == core.node for core in topo.cores for cpu in core.cpus)
    assert {n.id for n in topo.nodes} == set(machine.node_memory_mb)
    package_of = {c.id: c.package for c in machine.cpus}
    assert len(topo.sockets) == len({package_of[cpu] for cpu in topo.online_cpus})
    for core in topo.cores:
        assert {package_of[c] for c in core.cpus} == {package_of[core.id]}


def truth(machine: Machine) -> dict:
    """What `numaserve topology --json` must say about a fixture machine, from its description:
    online CPUs that some node lists, on that node; packages as sockets."""
    listed = machine.node_cpus or {
        n: [c.id for c in machine.cpus if c.node == n] for n in machine.node_memory_mb
    }
    node_of = {cpu: n for n, cpus in listed.items() for cpu in cpus}
    online = {c.id: c for c in machine.cpus if c.online and c.id in node_of}
    cores = [core for core in machine.expected_cores() if core[0] in online]
    return {
        "sockets": len({c.package for c in online.values()}),
        "nodes": {n: sorted(c for c in listed[n] if c in online) for n in machine.node_memory_mb},
        "cores": [(list(core), node_of[core[0]], online[core[0]].type) for core in cores],
    }


@pytest.mark.parametrize(
    "make",
    [m for m in NAMED if m.__name__ != "duplicated_nodes_firmware"],
    ids=lambda m: m.__name__,
)
def test_every_fixture_machine_reads_as_its_description_says_and_plans_onto_real_nodes(make):
    machine = make()
    topo = read_topology(FIXTURES / machine.name)
    seen = topo.to_json()
    assert {
        "sockets": seen["sockets"],
        "nodes": {n["id"]: n["cpus"] for n in seen["nodes"]},
        "cores": [(c["cpus"], c["node"], c["type"]) for c in seen["cores"]],
    } == truth(machine)
    plan = plan_placement(topo, PlacementConfig())
    for slot in plan.slots:
        (node,) = slot.binding.nodes
        assert set(slot.cpus) <= set(next(n.cpus for n in topo.nodes if n.id == node))
