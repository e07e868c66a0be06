"""CPU affinity and NUMA memory binding, checked in real child processes through /proc."""

import json
import shutil
import subprocess
import sys

import pytest

from numaserve.host.pinning import (
    MPOL_BIND,
    PINNED_BY_ENV,
    MembindRefused,
    PinningError,
    allowed_nodes,
    bound_by_cpuset,
    live_affinity,
    numactl_argv,
    pin_current_process,
    read_numa_maps,
    thread_settings,
)
from tests.harness.seccomp import UNDER_DEFAULT_PROFILE

CHILD = """
import json, sys
from numaserve.host.pinning import pin_current_process, get_mempolicy, PinningError
try:
    method, cpus, nodes = pin_current_process({cpus}, {nodes})
except PinningError as e:
    print(json.dumps({{"error": str(e)}}), flush=True)
    sys.exit(0)
policy = None if method == "cpuset" else get_mempolicy()  # refused where cpuset binds
print(json.dumps({{"method": method, "policy": policy}}), flush=True)
sys.stdin.read()  # stay alive until the test has looked at /proc
"""


def pinned_child(cpus, nodes, prefix=(), env=None):
    code = CHILD.format(cpus=list(cpus), nodes=list(nodes))
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    report = json.loads(proc.stdout.readline())
    return proc, report


def finish(proc):
    proc.stdin.close()
    proc.wait(10)


def test_process_is_bound_to_its_cpu_and_node():
    proc, report = pinned_child([1], [0])
    try:
        assert live_affinity(proc.pid) == (1,)
        assert report == {"method": "set_mempolicy", "policy": [MPOL_BIND, [0]]}
        maps = read_numa_maps(proc.pid)
        assert maps.policies == {"bind:0"}
        assert set(maps.pages_per_node) == {0}
        assert set(maps.anon_pages_per_node) == {0}
        assert 0 < sum(maps.anon_pages_per_node.values()) < sum(maps.pages_per_node.values())
    finally:
        finish(proc)


@pytest.mark.skipif(not shutil.which("numactl"), reason="numactl is not installed")
def test_binding_done_by_numactl_is_checked_not_redone():
    import os

    argv = numactl_argv(shutil.which("numactl"), [0], [0], [])
    proc, report = pinned_child([0], [0], prefix=argv, env={**os.environ, PINNED_BY_ENV: "numactl"})
    try:
        assert report == {"method": "numactl", "policy": [MPOL_BIND, [0]]}
        assert live_affinity(proc.pid) == (0,)
    finally:
        finish(proc)


def test_claimed_numactl_binding_that_is_missing_is_caught():
    import os

    proc, report = pinned_child([0], [0], env={**os.environ, PINNED_BY_ENV: "numactl"})
    finish(proc)
    assert "expected bind (mode 2) on nodes 0 (bound by numactl)" in report["error"]


def test_cpu_outside_the_machine_is_a_pinning_error():
    proc, report = pinned_child([4095], [0])
    finish(proc)
    assert report["error"].startswith("sched_setaffinity to CPUs 4095")


def test_node_that_does_not_exist_is_a_pinning_error():
    proc, report = pinned_child([0], [63])
    finish(proc)
    assert report["error"].startswith("set_mempolicy(MPOL_BIND, nodes 63)")


def test_thread_variables_are_set_for_the_slot():
    env = {}
    assert thread_settings(4, env) == (4, [])
    assert env == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}


def test_thread_variables_the_user_set_are_kept_with_a_warning():
    env = {"OMP_NUM_THREADS": "2"}
    threads, warnings = thread_settings(4, env)
    assert (threads, env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == (2, "2", "4")
    assert warnings == [
        "OMP_NUM_THREADS=2 is set in the environment; keeping it, although the slot has 4 CPU(s)"
    ]


def test_numactl_command_binds_cpus_and_memory():
    assert numactl_argv("/usr/bin/numactl", [3, 1, 2], [1], ["python"]) == [
        "/usr/bin/numactl",
        "--physcpubind=1-3",
        "--membind=1",
        "python",
    ]


def test_pinning_error_is_raised_in_process_for_an_empty_node_list():
    with pytest.raises(PinningError, match="no NUMA node"):
        pin_current_process(sorted(__import__("os").sched_getaffinity(0)), [])


def test_affinity_if_alive_is_none_for_a_process_that_is_gone_or_no_pid():
    import os

    from numaserve.host.cpuset import CPUSet
    from numaserve.host.pinning import affinity_if_alive, live_affinity

    assert affinity_if_alive(os.getpid()) == CPUSet(live_affinity(os.getpid()))
    assert affinity_if_alive(2**22 + 7) is None  # no such process
    assert affinity_if_alive(None) is None and affinity_if_alive(True) is None


def test_where_a_seccomp_profile_refuses_memory_policy_a_one_node_cpuset_binds_it():
    """As containerd's default profile runs a container without CAP_SYS_NICE; this host's
    cpuset.mems is its one node, the slot's."""
    assert allowed_nodes() == (0,)
    proc, report = pinned_child([1], [0], prefix=UNDER_DEFAULT_PROFILE)
    try:
        assert report == {"method": "cpuset", "policy": None}
        assert live_affinity(proc.pid) == (1,)
        assert allowed_nodes(proc.pid) == (0,)
    finally:
        finish(proc)


def test_where_memory_policy_is_refused_a_wider_cpuset_is_refused_with_both_remedies():
    refused = MembindRefused("set_mempolicy(MPOL_BIND, nodes 0): Operation not permitted")
    with pytest.raises(PinningError) as e:
        bound_by_cpuset((0,), (0, 1), refused)
    message = str(e.value)
    assert "Operation not permitted" in message and "cpuset.mems allows node(s) 0-1" in message
    assert "single-numa-node" in message and "CAP_SYS_NICE" in message
    assert "\n" not in message
