"""The cgroup CPU quota, found as a container and a host each see it. The /proc files and
cgroup trees here are made up in tmp_path, copied from what runc's containers and a host
show (cgroup v1 and v2); tests/test_container.py checks the warning in a real container."""

from pathlib import Path

import pytest

from numaserve.host.cpu_quota import cpu_quota, shared_pool_warning

POD = "/kubepods.slice/kubepods-burstable.slice/cri-containerd-abc.scope"


def made_up(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> float | None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return cpu_quota(proc, tmp_path)


V1_VIEWS = {
    # A runc container: its own cgroup mounted at the mount point (the mount's root is its path).
    "container": (
        f"3:cpuset:{POD}\n1:cpu:{POD}\n",
        f"92 91 0:29 {POD} /sys/fs/cgroup/cpu ro,nosuid - cgroup cgroup rw,cpu\n",
        "sys/fs/cgroup/cpu",
    ),
    # A host: the whole tree mounted, the process's cgroup below it.
    "host": (
        "4:cpu,cpuacct:/user.slice/job\n",
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        "sys/fs/cgroup/cpu,cpuacct/user.slice/job",
    ),
}


@pytest.mark.parametrize("view", V1_VIEWS)
def test_v1_finds_the_cgroup_as_a_container_and_a_host_see_it(tmp_path, view):
    cgroup, mountinfo, directory = V1_VIEWS[view]
    files = {
        f"{directory}/cpu.cfs_quota_us": "250000\n",
        f"{directory}/cpu.cfs_period_us": "100000\n",
    }
    assert made_up(tmp_path, cgroup, mountinfo, files) == 2.5


def test_a_v1_quota_of_minus_one_is_no_limit(tmp_path):
    quota = made_up(
        tmp_path,
        "1:cpu:/\n",
        "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
        {
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
        },
    )
    assert quota is None


@pytest.mark.parametrize("cpu_max, quota", [("250000 100000\n", 2.5), ("max 100000\n", None)])
def test_v2_reads_cpu_max(tmp_path, cpu_max, quota):
    found = made_up(
        tmp_path,
        "0::/\n",
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        {"sys/fs/cgroup/cpu.max": cpu_max},
    )
    assert found == quota


def test_no_cgroup_files_is_no_limit(tmp_path):
    assert cpu_quota(tmp_path / "nowhere", tmp_path) is None


def test_a_quota_below_the_cpus_given_is_a_warning_naming_the_static_cpu_manager():
    warning = shared_pool_warning(8, 60)
    assert "8 CPUs' worth of time" in warning and "on 60 CPUs" in warning
    assert "cpuManagerPolicy: static" in warning and "--cpuset-cpus" in warning


@pytest.mark.parametrize("quota", [None, 8, 9])
def test_cpus_of_its_own_are_no_warning(quota):
    """A Guaranteed pod's quota equals the CPUs its cpuset holds."""
    assert shared_pool_warning(quota, 8) is None
