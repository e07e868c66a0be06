"""The planner's invariants, on the fixture machines and on random topologies."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numaserve.config.schema import AUTO, PlacementConfig, PoolConfig
from numaserve.host.cpuset import CPUSet
from numaserve.host.placement import PlacementError, plan_placement
from numaserve.host.topology import Core, CPUTopology, Node, read_topology

FIXTURE_MACHINES = [
    "xeon8260_2socket",
    "epyc7402_2socket_nps4",
    "xeon6980p_snc3",
    "xeon_e2288g_smt_off",
    "xeon8380_cxl_offline",
    "xeon_e5_2690v4_interleaved",
    "epyc_kvm_2vcpu",
    "epyc7451_2socket_cpumap",
    "graviton2_nul",
    "i7_1370p_hybrid",
    "rk3588_big_little",
    "s390_z15_lpar",
    "node0_offline",
]


def pools(*specs):
    return tuple(
        PoolConfig(name=f"p{i}", max_tokens=32 * (i + 1), cores_per_instance=c, instances=n)
        for i, (c, n) in enumerate(specs)
    )


def check_invariants(topo: CPUTopology, placement: PlacementConfig, plan) -> None:
    core_of = {cpu: core for core in topo.cores for cpu in core.cpus}
    usable_by_node = {}
    reserved_cores = {core_of[c].id for c in plan.reserved_cpus}
    for core in topo.cores:
        if any(cpu in topo.allowed_cpus for cpu in core.cpus) and core.id not in reserved_cores:
            usable_by_node.setdefault((core.node, core.type), set()).add(core.id)

    seen_cpus, seen_cores = set(), set()
    for slot in plan.slots:
        cores = {core_of[cpu].id for cpu in slot.cpus}
        assert not seen_cpus & set(slot.cpus), f"{slot.name} shares a CPU"
        assert not seen_cores & cores, f"{slot.name} shares a physical core"
        seen_cpus |= set(slot.cpus)
        seen_cores |= cores
        assert slot.cpus - topo.allowed_cpus == CPUSet()
        assert not set(slot.cpus) & set(plan.reserved_cpus)
        assert slot.threads == len(slot.cpus)
        pool = next(p for p in placement.pools if p.name == slot.pool)
        assert len(cores) == pool.cores_per_instance
        assert len({core_of[c].type for c in slot.cpus}) == 1, f"{slot.name} mixes core types"
        if not placement.smt:
            assert len(slot.cpus) == len(cores), "one thread per core with smt: false"
        assert slot.binding.nodes == CPUSet({core_of[c].node for c in slot.cpus})
        if len(slot.binding.nodes) > 1:  # it may span only if no node could have held it
            for usable in usable_by_node.values():
                others = {core_of[c].id for s in plan.slots if s is not slot for c in s.cpus}
                assert len(usable - others) < pool.cores_per_instance, (
                    f"{slot.name} spans needlessly"
                )

    assert len(reserved_cores) == placement.reserved_cores
    for pool in placement.pools:
        placed = plan.pool_slots(pool.name)
        if pool.instances == AUTO:
            assert placed
            for usable in usable_by_node.values():  # auto leaves no room for another instance
                assert len(usable - seen_cores) < pool.cores_per_instance
        else:
            assert len(placed) == pool.instances


@pytest.mark.parametrize("machine", FIXTURE_MACHINES)
@pytest.mark.parametrize("smt", [False, True])
def test_fixture_machines_get_valid_plans(sysfs, machine, smt):
    topo = read_topology(sysfs(machine))
    placement = PlacementConfig(reserved_cores=1, smt=smt, pools=pools((1, AUTO)))
    if len(topo.cores) > 8:
        placement = PlacementConfig(reserved_cores=1, smt=smt, pools=pools((1, AUTO), (4, 2)))
    check_invariants(topo, placement, plan_placement(topo, placement))


def test_hybrid_cpu_fills_performance_cores_first_and_never_mixes_types(sysfs):
    topo = read_topology(sysfs("i7_1370p_hybrid"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((1, AUTO))))
    assert [s.cpus.sorted() for s in plan.slots] == [
        (c,) for c in (0, 2, 4, 6, 8, 10, *range(12, 20))
    ]


def test_an_instance_that_no_longer_fits_on_performance_cores_takes_efficiency_cores(sysfs):
    topo = read_topology(sysfs("i7_1370p_hybrid"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((4, 2))))
    assert [s.cpus.sorted() for s in plan.slots] == [(0, 2, 4, 6), (12, 13, 14, 15)]


def test_a_pool_may_be_limited_to_performance_cores(sysfs):
    topo = read_topology(sysfs("rk3588_big_little"))
    pool = PoolConfig(name="fast", max_tokens=512, core_types=("performance",))
    plan = plan_placement(topo, PlacementConfig(pools=(pool,)))
    assert [s.cpus.sorted() for s in plan.slots] == [(4,), (5,), (6,), (7,)]
    assert plan.idle_cpus == CPUSet.parse("0-3")


def test_a_pool_asking_for_core_types_the_machine_lacks_is_an_error(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    pool = PoolConfig(name="little", max_tokens=512, core_types=("efficiency",))
    with pytest.raises(PlacementError, match="may use efficiency cores only, but this machine"):
        plan_placement(topo, PlacementConfig(pools=(pool,)))


def test_smt_off_leaves_siblings_idle(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((1, AUTO))))
    assert len(plan.slots) == 48
    assert set(plan.idle_cpus) == set(range(48, 96))


def test_smt_on_gives_both_siblings_and_two_threads(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    plan = plan_placement(topo, PlacementConfig(smt=True, pools=pools((1, AUTO))))
    assert plan.slots[0].cpus == CPUSet.of([0, 48])
    assert plan.slots[0].threads == 2


def test_reserved_cores_are_the_lowest_numbered_of_each_node_in_turn_with_their_siblings(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))  # node 0: CPUs 0-23,48-71; node 1: the rest
    plan = plan_placement(topo, PlacementConfig(reserved_cores=3, pools=pools((1, AUTO))))
    assert plan.reserved_cpus == CPUSet.parse("0-1,24,48-49,72")


def test_auto_spreads_over_uneven_nodes_without_spanning(sysfs):
    topo = read_topology(sysfs("xeon6980p_snc3"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((4, AUTO))))
    per_node = [sum(1 for s in plan.slots if s.node == n) for n in range(3)]
    assert per_node == [10, 10, 10]  # 43 // 4, 43 // 4, 42 // 4
    assert all(s.node is not None for s in plan.slots)


def test_fixed_instances_alternate_between_nodes(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((4, 4))))
    assert sorted(s.node for s in plan.slots) == [0, 0, 1, 1]


def test_instance_bigger_than_any_node_spans_nodes_of_one_socket(sysfs):
    topo = read_topology(sysfs("epyc7402_2socket_nps4"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((12, 1))))
    (slot,) = plan.slots
    assert slot.node is None
    assert len(slot.binding.nodes) == 2
    assert {topo.nodes[n].id for n in slot.binding.nodes} <= {0, 1, 2, 3}


def test_instances_take_neighbouring_cores(sysfs):
    topo = read_topology(sysfs("epyc7402_2socket_nps4"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((3, AUTO))))
    assert plan.slots[0].cpus == CPUSet.parse("0-2")  # one CCX of the 7402


def test_interleaved_numbering_keeps_instances_on_one_socket(sysfs):
    topo = read_topology(sysfs("xeon_e5_2690v4_interleaved"))
    plan = plan_placement(topo, PlacementConfig(pools=pools((2, AUTO))))
    assert plan.slots[0].cpus == CPUSet.of([0, 2])


def test_offline_and_disallowed_cpus_are_never_placed(sysfs):
    topo = read_topology(sysfs("xeon8380_cxl_offline"), allowed_cpus=range(0, 20))
    plan = plan_placement(topo, PlacementConfig(smt=True, pools=pools((1, AUTO))))
    assert {c for s in plan.slots for c in s.cpus} == set(range(20))


def test_too_many_instances_is_an_error_that_says_what_would_fit(sysfs):
    topo = read_topology(sysfs("xeon_e2288g_smt_off"))
    with pytest.raises(PlacementError) as e:
        plan_placement(topo, PlacementConfig(reserved_cores=1, pools=pools((4, 2))))
    msg = str(e.value)
    assert "asks for 2 instance(s) of 4 physical core(s)" in msg
    assert "this machine has 8 allowed physical core(s) (node 0: 8)" in msg
    assert "7 are free for it after reserving 1 core(s)" in msg
    assert "Would fit: 1 instance(s) of 4 core(s)" in msg


def test_auto_pool_with_no_room_left_is_an_error(sysfs):
    topo = read_topology(sysfs("epyc_kvm_2vcpu"))
    with pytest.raises(PlacementError, match=r"'p1' \(instances: auto\) gets no instance"):
        plan_placement(topo, PlacementConfig(pools=pools((2, 1), (1, AUTO))))


def test_reserving_every_core_is_an_error(sysfs):
    topo = read_topology(sysfs("epyc_kvm_2vcpu"))
    with pytest.raises(PlacementError, match="Would fit: reserved_cores <= 1"):
        plan_placement(topo, PlacementConfig(reserved_cores=2, pools=pools((1, AUTO))))


@st.composite
def topologies(draw):
    node_sizes = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4))
    smt = draw(st.booleans())
    kinds = ["performance", "efficiency"] if draw(st.booleans()) else ["performance"]
    cores, nodes, cpu = [], [], 0
    for n, size in enumerate(node_sizes):
        node_cpus = []
        for _ in range(size):
            threads = (cpu, cpu + 1) if smt else (cpu,)
            cpu += len(threads)
            node_cpus += threads
            kind = draw(st.sampled_from(kinds))
            cores.append(Core(socket=n // 2, die=0, node=n, cpus=threads, type=kind))
        nodes.append(Node(id=n, cpus=tuple(node_cpus), memory_mb=1024))
    online = [c for core in cores for c in core.cpus]
    allowed = draw(st.sets(st.sampled_from(online))) if online else set()
    return CPUTopology(tuple(cores), tuple(nodes), CPUSet(allowed), (), "test")


@st.composite
def placements(draw):
    specs = draw(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4)), min_size=0, max_size=3))
    with_auto = draw(st.booleans()) or not specs
    if with_auto:
        specs.append((draw(st.integers(1, 4)), AUTO))
    return PlacementConfig(
        reserved_cores=draw(st.integers(0, 2)), smt=draw(st.booleans()), pools=pools(*specs)
    )


@settings(max_examples=400, deadline=None)
@given(topo=topologies(), placement=placements())
def test_every_plan_keeps_the_invariants_or_explains_why_not(topo, placement):
    usable = sum(1 for c in topo.cores if CPUSet(c.cpus) & topo.allowed_cpus)
    fixed_demand = sum(
        p.cores_per_instance * p.instances for p in placement.pools if p.instances != AUTO
    )
    try:
        plan = plan_placement(topo, placement)
    except PlacementError as e:
        msg = str(e)
        if usable <= placement.reserved_cores:
            assert "no allowed CPUs" in msg or "reserved_cores" in msg
        elif fixed_demand > usable - placement.reserved_cores or len(topo.core_types) > 1:
            # (on a hybrid machine, cores enough in all may still be too few of one type)
            assert "Would fit:" in msg and ("asks for" in msg or "gets no instance" in msg)
        else:  # the fixed pools fit, so only the auto pool can have been left without room
            assert "(instances: auto) gets no instance" in msg
        return
    assert fixed_demand <= usable - placement.reserved_cores
    check_invariants(topo, placement, plan)
