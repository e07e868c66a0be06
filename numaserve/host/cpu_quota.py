"""The CPU time this process's cgroup may use (its CFS quota), and what it says about how the
CPUs were handed out.

In a Kubernetes pod the kubelet's static CPU manager gives a Guaranteed container with whole
CPUs a cpuset of its own; on a node without it (or for a pod that is not Guaranteed) the
container runs on the node's whole shared pool, held back only by a quota. numaserve pins
inside whatever cpuset it is given either way, but on a shared pool other pods run on the
same CPUs and the quota throttles every instance: worth a warning that names the fix.

The cgroup is found as the JDK finds it (cgroup v1 and v2 alike): this process's path in
/proc/self/cgroup, under the mount in /proc/self/mountinfo whose root it lies in. A container
that mounts its own cgroup at the mount point, a host that mounts the whole tree: both resolve.
"""

from __future__ import annotations

from pathlib import Path


def cpu_quota(proc: Path = Path("/proc/self"), root: Path = Path("/")) -> float | None:
    """CPUs' worth of time a second this process's cgroup may use; None where unlimited or
    unknown. `proc` and `root`: another process, or a made-up tree in tests."""
    try:
        cgroups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in cgroups:  # "ID:CONTROLLERS:PATH"; v2 is "0::PATH"
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            directory = _directory(mounts, "cgroup2", None, path, root)
            quota = directory and _v2_quota(directory)
        elif "cpu" in controllers.split(","):
            directory = _directory(mounts, "cgroup", "cpu", path, root)
            quota = directory and _v1_quota(directory)
        else:
            continue
        if quota:
            return quota
    return None


def _directory(
    mounts: list[str], fstype: str, controller: str | None, path: str, root: Path
) -> Path | None:
    """Where `path` of that hierarchy is mounted in this process's view."""
    for line in mounts:
        fields, _, after = line.partition(" - ")
        parts, extra = fields.split(), after.split()
        if len(parts) < 5 or len(extra) < 3 or extra[0] != fstype:
            continue
        if controller is not None and controller not in extra[2].split(","):
            continue
        mount_root, mount_point = parts[3], parts[4]
        if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
            relative = path[len(mount_root) :].lstrip("/")
            return root / mount_point.lstrip("/") / relative
    return None


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 else quota / period


def shared_pool_warning(quota: float | None, allowed: int) -> str | None:
    """A warning where a quota, not a cpuset of its own, limits this server's CPUs."""
    if quota is None or quota >= allowed:
        return None
    return (
        f"this server may use {quota:g} CPUs' worth of time (its cgroup's CPU quota) but runs "
        f"on {allowed} CPUs that others share: it was not given CPUs of its own. Instances are "
        "pinned within those CPUs, and the quota throttles them all. In Kubernetes: a "
        "Guaranteed pod with whole CPUs on a node with cpuManagerPolicy: static "
        "(docs/kubernetes.md); under podman or docker: --cpuset-cpus instead of --cpus"
    )
