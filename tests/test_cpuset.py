"""The CPU-set value (host/cpuset.py): the kernel's list format both ways, set algebra as
sets have it, the whole cores and nodes under a set on the committed fixture machines, its
wire form, and the binding (CPUs and nodes) every spec and record holds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numaserve.config.schema import ConfigError
from numaserve.host.cpulist import CPUListError
from numaserve.host.cpuset import Binding, CPUSet, plain
from numaserve.host.topology import read_topology
from numaserve.processes.specs import FrontendSpec

cpu_sets = st.frozensets(st.integers(0, 255)).map(CPUSet)


@given(cpu_sets)
def test_the_kernels_list_format_reads_back_what_it_printed(cpus):
    assert CPUSet.parse(str(cpus)) == cpus


def test_it_prints_ranges_as_numactl_and_taskset_take_them():
    assert str(CPUSet.of([8, 0, 1, 2, 3, 10, 11])) == "0-3,8,10-11"
    assert str(CPUSet()) == "" and CPUSet.parse("") == CPUSet()


def test_a_list_that_is_not_the_kernels_is_refused():
    with pytest.raises(CPUListError, match="bad range"):
        CPUSet.parse("3-1")


def test_the_list_format_is_read_by_parse_not_taken_for_members():
    with pytest.raises(TypeError, match=r"CPUSet\.parse reads the list format"):
        CPUSet("0-3")  # type: ignore[arg-type]


@given(cpu_sets, cpu_sets)
def test_union_intersection_and_difference_are_the_sets(a, b):
    assert (a | b).ids == a.ids | b.ids
    assert (a & b).ids == a.ids & b.ids
    assert (a - b).ids == a.ids - b.ids


def test_it_iterates_in_order_and_is_immutable():
    cpus = CPUSet.of([5, 1, 3])
    assert list(cpus) == [1, 3, 5] and cpus.sorted() == (1, 3, 5) and 3 in cpus
    with pytest.raises(AttributeError):
        cpus._ids = frozenset()  # type: ignore[misc]


def test_the_whole_cores_under_a_set_hold_every_smt_sibling(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))  # 2 threads a core
    core = topo.cores[0]
    assert CPUSet.of(core.cpus[:1]).whole_cores(topo) == CPUSet.of(core.cpus)
    assert CPUSet().whole_cores(topo) == CPUSet()


def test_its_nodes_are_those_of_its_cpus(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    first = {c.node: c for c in topo.cores}
    both = CPUSet.of([*first[0].cpus, *first[1].cpus])
    assert both.nodes(topo) == CPUSet.of([0, 1])
    assert CPUSet.of(first[1].cpus).nodes(topo) == CPUSet.of([1])


@given(cpu_sets)
def test_on_the_wire_it_is_its_list_ascending_and_reads_back(cpus):
    assert CPUSet.from_plain(json.loads(json.dumps(cpus, default=plain))) == cpus


@pytest.mark.parametrize("value", ["0-3", [0, -1], [0, True], [1.5], {"cpus": [0]}, None])
def test_a_wire_value_that_is_not_a_list_of_cpu_numbers_is_refused(value):
    with pytest.raises(ValueError, match="expected a list of CPU or node numbers"):
        CPUSet.from_plain(value)


def test_a_binding_takes_its_nodes_from_the_topology_and_says_where_it_runs(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    on_node_1 = next(c for c in topo.cores if c.node == 1)
    binding = Binding.on(on_node_1.cpus, topo)
    assert binding.nodes == CPUSet.of([1]) and binding.node == 1
    assert str(binding) == f"CPUs {CPUSet.of(on_node_1.cpus)}, node(s) 1"
    assert not Binding() and str(Binding()) == "not pinned" and Binding().node is None


def test_a_spec_carries_its_binding_as_lists_and_reads_it_back():
    spec = FrontendSpec(
        endpoint="tcp://127.0.0.1:5555", routes=(), max_message_bytes=1,
        binding=Binding.of([2, 3], [0]),
    )  # fmt: skip
    assert json.loads(spec.to_json())["binding"] == {"cpus": [2, 3], "nodes": [0]}
    assert FrontendSpec.from_json(spec.to_json()) == spec


def test_a_spec_whose_binding_is_not_lists_of_numbers_is_refused_naming_the_key():
    text = json.dumps({"endpoint": "e", "routes": [], "max_message_bytes": 1,
                       "binding": {"cpus": "0-3", "nodes": [0]}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"binding\.cpus: expected a list of CPU"):
        FrontendSpec.from_json(text)
