"""Reading the ISA flags: from /proc/cpuinfo itself, at once, with no helper process (py-cpuinfo
ran a child interpreter for it: a second or more of every start, prepare and instance)."""

import subprocess

import pytest

from numaserve.host.isa import INTERESTING_ISA, detect_isa, isa_from_cpuinfo

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2

processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
"""


def test_the_flags_line_gives_the_isa_in_a_fixed_order():
    text = AVX2_ONLY.replace("avx2 fma", "amx_int8 avx2 avx512_vnni fma avx512f")
    assert isa_from_cpuinfo(text) == ("avx2", "avx512f", "avx512_vnni", "amx_int8")


def test_an_avx2_only_cpu_has_no_vnni():
    assert isa_from_cpuinfo(AVX2_ONLY) == ("avx2",)


def test_no_flags_line_is_no_isa():
    assert isa_from_cpuinfo("processor\t: 0\nmodel name\t: something\n") == ()


def test_the_isa_is_read_without_starting_a_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"started a process: {args[:1]}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    assert set(detect_isa()) <= set(INTERESTING_ISA)


@pytest.mark.parametrize("flag", INTERESTING_ISA)
def test_every_flag_we_look_for_is_the_kernels_own_name(flag):
    assert isa_from_cpuinfo(f"flags\t: {flag}\n") == (flag,)
