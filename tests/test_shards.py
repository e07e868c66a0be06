"""Router shards: which instances each owns and where it runs (host/shards.py). Pure."""

import pytest

from numaserve.config.schema import AUTO, Config, PlacementConfig, ServerConfig
from numaserve.host.cpuset import Binding
from numaserve.host.placement import PlacementError, plan_placement
from numaserve.host.shards import plan_shards
from numaserve.host.topology import read_topology
from numaserve.processes.specs import deployment
from tests.test_placement import FIXTURE_MACHINES, pools


def shards_of(topo, placement, routers=AUTO):
    plan = plan_placement(topo, placement)
    return plan, plan_shards(plan, topo, routers)


BIG_ENOUGH = [m for m in FIXTURE_MACHINES if m != "epyc_kvm_2vcpu"]  # 4+ instances


@pytest.mark.parametrize("machine", BIG_ENOUGH)
@pytest.mark.parametrize("routers", [AUTO, 1, 2])
def test_every_instance_has_one_shard_and_every_shard_has_every_pool(sysfs, machine, routers):
    topo = read_topology(sysfs(machine))
    placement = PlacementConfig(reserved_cores=1, pools=pools((1, 2), (1, AUTO)))
    plan, shards = shards_of(topo, placement, routers)
    owned = [name for shard in shards for name in shard.slots]
    assert sorted(owned) == sorted(s.name for s in plan.slots)
    slot = {s.name: s for s in plan.slots}
    for shard in shards:
        assert {slot[name].pool for name in shard.slots} == {"p0", "p1"}
        assert set(shard.binding.cpus) <= set(plan.reserved_cpus)


def test_auto_runs_a_shard_per_node_each_pinned_to_a_reserved_core_of_its_node(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))  # 2 nodes; node 1 holds cores 24-47
    plan, shards = shards_of(topo, PlacementConfig(reserved_cores=2, pools=pools((1, AUTO))))
    assert [s.node for s in shards] == [0, 1]
    assert [s.binding.cpus.sorted() for s in shards] == [
        (0, 48),
        (24, 72),
    ]  # with their SMT siblings
    node_of = {cpu: core.node for core in topo.cores for cpu in core.cpus}
    slot = {s.name: s for s in plan.slots}
    for shard in shards:
        assert {node_of[cpu] for name in shard.slots for cpu in slot[name].cpus} == {shard.node}


def test_auto_on_one_node_is_one_shard(sysfs):
    topo = read_topology(sysfs("xeon_e2288g_smt_off"))
    _, shards = shards_of(topo, PlacementConfig(reserved_cores=1, pools=pools((1, AUTO))))
    assert len(shards) == 1


def test_auto_never_makes_more_shards_than_the_smallest_pool_has_instances(sysfs):
    topo = read_topology(sysfs("epyc7402_2socket_nps4"))  # 8 nodes
    _, shards = shards_of(topo, PlacementConfig(pools=pools((1, 3), (1, AUTO))))
    assert len(shards) == 3


def test_shards_without_a_reserved_core_on_their_node_share_one_elsewhere(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    _, shards = shards_of(topo, PlacementConfig(reserved_cores=1, pools=pools((1, AUTO))))
    assert [s.binding.cpus.sorted() for s in shards] == [(0, 48), (0, 48)]


def test_nothing_reserved_leaves_the_shards_unpinned(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    _, shards = shards_of(topo, PlacementConfig(pools=pools((1, AUTO))))
    assert [s.binding for s in shards] == [Binding(), Binding()]


def test_more_routers_than_a_pool_has_instances_is_refused_with_what_fits(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    with pytest.raises(PlacementError, match=r"pool 'p0' has 2 instance.*routers <= 2"):
        shards_of(topo, PlacementConfig(pools=pools((1, 2), (1, AUTO))), routers=3)


def test_the_frontend_binds_its_memory_to_the_nodes_of_its_reserved_cores(sysfs, tmp_path):
    topo = read_topology(sysfs("xeon8260_2socket"))
    placement = PlacementConfig(reserved_cores=2, pools=pools((1, AUTO)))
    config = Config(server=ServerConfig(routers=2), placement=placement)
    frontend = deployment(config, plan_placement(topo, placement), topo, tmp_path).frontend
    assert frontend.binding == Binding.of([0, 24, 48, 72], [0, 1])
