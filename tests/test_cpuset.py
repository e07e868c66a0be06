"""The CPU-set value (host/cpuset.py): the kernel's list format both ways, set algebra as
sets have it, and the whole cores and nodes under a set on the committed fixture machines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numaserve.host.cpulist import CPUListError
from numaserve.host.cpuset import CPUSet
from numaserve.host.topology import read_topology

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


@given(cpu_sets, cpu_sets)
def test_union_intersection_and_difference_are_the_sets(a, b):
    assert (a | b).cpus == a.cpus | b.cpus
    assert (a & b).cpus == a.cpus & b.cpus
    assert (a - b).cpus == a.cpus - b.cpus


def test_it_iterates_in_order_and_is_immutable():
    cpus = CPUSet.of([5, 1, 3])
    assert list(cpus) == [1, 3, 5] and cpus.sorted() == (1, 3, 5) and 3 in cpus
    with pytest.raises(AttributeError):
        cpus.cpus = frozenset()  # type: ignore[misc]


def test_the_whole_cores_under_a_set_hold_every_smt_sibling(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))  # 2 threads a core
    core = topo.cores[0]
    assert CPUSet.of(core.cpus[:1]).whole_cores(topo) == CPUSet.of(core.cpus)
    assert CPUSet().whole_cores(topo) == CPUSet()


def test_its_nodes_are_those_of_its_cpus(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))
    first = {c.node: c for c in topo.cores}
    both = CPUSet.of([*first[0].cpus, *first[1].cpus])
    assert both.nodes(topo) == (0, 1)
    assert CPUSet.of(first[1].cpus).nodes(topo) == (1,)
