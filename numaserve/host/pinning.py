"""Bind the calling process to a slot's CPUs and NUMA memory, before any numeric runtime starts.

CPU affinity and memory policy are inherited by threads created afterwards, so this must run
before torch (and its OpenMP pool) is imported. Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import shutil
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from numaserve.host.cpulist import format_cpulist, parse_cpulist
from numaserve.host.cpuset import Binding, CPUSet

MPOL_BIND = 2
_MAX_NODES = 1024  # bits in the node masks we pass the kernel; more than any machine has
_WORD_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
# (set_mempolicy, get_mempolicy) syscall numbers; glibc has no wrapper, libnuma may be absent.
_SYSCALLS = {"x86_64": (238, 239), "aarch64": (237, 236), "ppc64le": (261, 260)}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
PINNED_BY_ENV = "NUMASERVE_PINNED_BY"  # set by the launcher when numactl did the binding


class PinningError(RuntimeError):
    pass


class MembindRefused(PinningError):
    """The kernel refused the memory-policy call itself (EPERM): a seccomp profile without
    CAP_SYS_NICE, as containerd's and Docker's default ones are."""


# Bound by what: numactl or set_mempolicy (a policy of the process's own), or the cgroup's
# cpuset.mems where the policy calls are refused and the cgroup allows the slot's nodes alone.
BOUND_BY_CPUSET = "cpuset"
# What status, the metrics and the logs call each way the memory is bound.
BOUND_BY = {
    "numactl": "numactl --membind",
    "set_mempolicy": "set_mempolicy(MPOL_BIND)",
    BOUND_BY_CPUSET: "cgroup cpuset.mems (memory-policy calls refused here)",
}
REMEDIES = (
    "run one pod per NUMA node (the kubelet's Topology Manager with policy single-numa-node, "
    "and its Memory Manager), so that cpuset.mems is the slot's node alone, or grant the "
    "container CAP_SYS_NICE"
)


@dataclass(frozen=True)
class PinReport:
    binding: Binding
    membind: str  # "numactl", "set_mempolicy" or "cpuset": what bound the memory
    threads: int


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _syscall_numbers() -> tuple[int, int]:
    try:
        return _SYSCALLS[platform.machine()]
    except KeyError:
        raise PinningError(f"memory binding is not supported on {platform.machine()}") from None


def _mask(nodes: Iterable[int]):
    words = (ctypes.c_ulong * (_MAX_NODES // _WORD_BITS))()
    for n in nodes:
        if not 0 <= n < _MAX_NODES:
            raise PinningError(f"NUMA node {n} is out of range")
        words[n // _WORD_BITS] |= 1 << (n % _WORD_BITS)
    return words


def set_membind(nodes: Iterable[int]) -> None:
    """set_mempolicy(MPOL_BIND): this thread, and threads it creates, allocate only on `nodes`."""
    nodes = sorted(set(nodes))
    if not nodes:
        raise PinningError("no NUMA node to bind memory to")
    mask = _mask(nodes)
    number, _ = _syscall_numbers()
    # maxnode counts one more than the bits the kernel reads (a long-standing quirk).
    if _libc().syscall(number, MPOL_BIND, mask, ctypes.c_ulong(_MAX_NODES + 1)) != 0:
        err = ctypes.get_errno()
        refused = MembindRefused if err == errno.EPERM else PinningError
        raise refused(
            f"set_mempolicy(MPOL_BIND, nodes {format_cpulist(nodes)}): {os.strerror(err)}"
        )


def get_mempolicy() -> tuple[int, tuple[int, ...]]:
    """This thread's memory policy: (mode, nodes)."""
    mode = ctypes.c_int(0)
    mask = _mask(())
    _, number = _syscall_numbers()
    if (
        _libc().syscall(number, ctypes.byref(mode), mask, ctypes.c_ulong(_MAX_NODES + 1), None, 0)
        != 0
    ):
        raise PinningError(f"get_mempolicy: {os.strerror(ctypes.get_errno())}")
    nodes = tuple(
        w * _WORD_BITS + b
        for w, word in enumerate(mask)
        for b in range(_WORD_BITS)
        if word >> b & 1
    )
    return mode.value, nodes


def _status_list(pid: int | str, field: str) -> tuple[int, ...]:
    """A list field of /proc/PID/status (`Cpus_allowed_list`, `Mems_allowed_list`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return tuple(parse_cpulist(line.split(":", 1)[1]))
    raise PinningError(f"/proc/{pid}/status has no {field}")


def live_affinity(pid: int | str = "self") -> tuple[int, ...]:
    """The CPUs a process may run on, as the kernel reports them in /proc/PID/status."""
    return _status_list(pid, "Cpus_allowed_list")


def affinity_if_alive(pid: object) -> CPUSet | None:
    """The CPUs the kernel lets `pid` run on now (`live_affinity`), as a status reports them;
    None for a process that is gone (or what is not a pid). The one reading of another
    process's live affinity: the supervisor's, a router shard's and /metrics'."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return None
    try:
        return CPUSet(live_affinity(pid))
    except (OSError, PinningError):
        return None


def thread_settings(threads: int, environ: MutableMapping[str, str]) -> tuple[int, list[str]]:
    """Set OMP/MKL thread counts for the slot, keeping (and warning about) any the user set."""
    warnings = []
    effective = threads
    for var in THREAD_VARS:
        given = environ.get(var)
        if given is None:
            environ[var] = str(threads)
        elif given != str(threads):
            warnings.append(
                f"{var}={given} is set in the environment; keeping it, although the slot has "
                f"{threads} CPU(s)"
            )
            if var == "OMP_NUM_THREADS" and given.isdigit() and int(given) > 0:
                effective = int(given)
    return effective, warnings


def pin_current_process(
    cpus: Iterable[int], nodes: Iterable[int], environ=os.environ
) -> tuple[str, tuple, tuple]:
    """Bind CPUs and memory and check the kernel agrees. Returns (method, cpus, nodes).

    Under numactl (the launcher sets PINNED_BY_ENV) the binding is already done and only checked.
    Where the memory-policy calls are refused, the cgroup's cpuset.mems must bind it
    (bound_by_cpuset).
    """
    cpus, nodes = tuple(sorted(set(cpus))), tuple(sorted(set(nodes)))
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        raise PinningError(
            f"sched_setaffinity to CPUs {format_cpulist(cpus)}: {e.strerror}"
        ) from None
    if tuple(sorted(os.sched_getaffinity(0))) != cpus:
        raise PinningError(
            f"affinity is {format_cpulist(os.sched_getaffinity(0))}, not {format_cpulist(cpus)}"
        )
    method = "numactl" if environ.get(PINNED_BY_ENV) == "numactl" else "set_mempolicy"
    if method == "set_mempolicy":
        try:
            set_membind(nodes)
        except MembindRefused as e:
            return bound_by_cpuset(nodes, allowed_nodes(), e), cpus, nodes
    mode, bound = get_mempolicy()
    if (mode, bound) != (MPOL_BIND, nodes):
        raise PinningError(
            f"memory policy is mode {mode} on nodes {format_cpulist(bound) or '-'}, expected "
            f"bind (mode {MPOL_BIND}) on nodes {format_cpulist(nodes)} (bound by {method})"
        )
    return method, cpus, nodes


def allowed_nodes(pid: int | str = "self") -> tuple[int, ...]:
    """The nodes a process may take memory from: its cgroup's cpuset.mems, as the kernel
    applies it (/proc/PID/status)."""
    return _status_list(pid, "Mems_allowed_list")


def bound_by_cpuset(nodes: tuple[int, ...], allowed: tuple[int, ...], refused: Exception) -> str:
    """Where the memory-policy calls are refused: the cgroup binds the memory already when it
    allows the slot's nodes alone; wider, the slot's memory could land off its node, and that
    is never served silently."""
    if allowed == nodes:
        return BOUND_BY_CPUSET
    raise PinningError(
        f"{refused}, and the cgroup's cpuset.mems allows node(s) {format_cpulist(allowed)}, "
        f"not the slot's {format_cpulist(nodes)} alone: its memory could land off its node. "
        f"To serve here, {REMEDIES} (docs/kubernetes.md#memory-binding-in-a-pod)"
    )


def restart_under_numactl(method: str, binding: Binding, argv: list[str], log) -> None:
    """Start this process over under numactl, where it is installed and did not start us:
    the binding made in-process (checked there, so a bad slot exits PINNING rather than
    numactl's 1) covers only memory touched after it, and the interpreter's start-up pages
    would stay wherever they first landed. Returns only where numactl cannot run."""
    numactl = shutil.which("numactl")
    if method != "set_mempolicy" or numactl is None:  # numactl's own calls would be refused
        return
    try:
        os.execve(
            numactl,
            numactl_argv(numactl, binding.cpus, binding.nodes, argv),
            {**os.environ, PINNED_BY_ENV: "numactl"},
        )
    except OSError as e:
        log.warning("cannot run %s (%s); keeping the in-process binding", numactl, e.strerror)


def numactl_argv(
    numactl: str, cpus: Iterable[int], nodes: Iterable[int], argv: list[str]
) -> list[str]:
    return [
        numactl,
        f"--physcpubind={format_cpulist(cpus)}",
        f"--membind={format_cpulist(nodes)}",
        *argv,
    ]


@dataclass(frozen=True)
class NumaMaps:
    """What /proc/PID/numa_maps says: the policy of each mapping, and where its pages sit."""

    policies: frozenset[str]  # e.g. {"bind:0"}; "default" where a mapping has no policy
    pages_per_node: dict[int, int]
    # Pages of mappings backed by no file (heap, stacks, weights it holds itself): its own.
    # File pages sit wherever the page cache first put them, whatever this process's policy.
    anon_pages_per_node: dict[int, int]


def read_numa_maps(pid: int | str = "self", file: str | None = None) -> NumaMaps:
    """`file`: of that file's mappings alone (a shared weights file's pages, say)."""
    policies: set[str] = set()
    pages: dict[int, int] = {}
    anon: dict[int, int] = {}
    for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines():
        fields = line.split()
        if len(fields) < 2 or (file is not None and f"file={file}" not in fields[2:]):
            continue
        policies.add(fields[1])
        # Counts are per mapping: a private file mapping (a library's data) mixes pages it
        # copied (anon=) with page-cache ones, so only mappings with no file count here.
        is_anon = not any(f.startswith("file=") for f in fields[2:])
        for f in fields[2:]:
            if f.startswith("N") and "=" in f:
                node, count = map(int, f[1:].split("=", 1))
                pages[node] = pages.get(node, 0) + count
                if is_anon:
                    anon[node] = anon.get(node, 0) + count
    return NumaMaps(frozenset(policies), pages, anon)
