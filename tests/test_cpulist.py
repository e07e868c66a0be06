import pytest
from hypothesis import given
from hypothesis import strategies as st

from numaserve.host.cpulist import CPUListError, format_cpulist, parse_cpulist, parse_cpumask


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


@pytest.mark.parametrize(
    "mask, cpus",
    [
        ("00000000,0000ff0f", [0, 1, 2, 3, *range(8, 16)]),
        ("00000001,00000000", [32]),
        ("f", [0, 1, 2, 3]),
        ("00000000,00000000", []),  # a memory-only node's cpumap
    ],
)
def test_hex_masks_are_read_word_by_word_most_significant_first(mask, cpus):
    assert parse_cpumask(mask) == cpus


def test_a_trailing_nul_byte_is_tolerated_in_both_forms():
    assert parse_cpumask("0000000f\x00\n") == parse_cpulist("0-3\x00") == [0, 1, 2, 3]


def test_a_malformed_mask_is_rejected_with_the_text():
    with pytest.raises(CPUListError, match="not a CPU mask: '0x0g'"):
        parse_cpumask("0x0g")
