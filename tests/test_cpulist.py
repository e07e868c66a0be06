import pytest
from hypothesis import given
from hypothesis import strategies as st

from numaserve.host.cpulist import CPUListError, format_cpulist, parse_cpulist


def test_ranges_and_singles_are_expanded():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_empty_list_is_a_memory_only_node():
    assert parse_cpulist("\n") == []


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "-1", "1,,2"])
def test_malformed_lists_are_rejected_with_the_text(bad):
    with pytest.raises(CPUListError, match="not a CPU list"):
        parse_cpulist(bad)


def test_format_collapses_runs_like_the_kernel():
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"


@given(st.sets(st.integers(0, 512)))
def test_format_then_parse_round_trips(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)
