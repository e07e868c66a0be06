"""CPU topology read from Linux sysfs (or `lscpu -p` where sysfs is incomplete).

Everything is read under a root that stands in for `/sys`, so tests and `--sysfs-root` can
describe machines other than this one. A physical core is identified by its lowest online
thread id; `core_id` alone is not unique (it repeats across packages and is often sparse).

Real machines are untidy (Documentation/ABI/stable/sysfs-devices-system-cpu, -node): CPU sets
come as lists or as hex masks, `physical_package_id` may be -1, firmware may give a CPU to no
node or to several, and hybrid CPUs mix core types. The reader takes what is there, never
guesses a node, and says in `warnings` what it left out and why.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from numaserve.host.cpulist import (
    BLANK,
    CPUListError,
    format_cpulist,
    parse_cpulist,
    parse_cpumask,
)
from numaserve.host.cpuset import CPUSet
from numaserve.host.isa import detect_isa

LIVE_SYSFS = Path("/sys")

# Core types, fastest first. Intel hybrids name two (the kernel's cpu_core and cpu_atom PMUs);
# ARM SoCs rank their clusters by `cpu_capacity`, and a third, middle class is MID.
PERFORMANCE, MID, EFFICIENCY = "performance", "mid", "efficiency"
CORE_TYPES = (PERFORMANCE, MID, EFFICIENCY)


class TopologyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Core:
    """One physical core: its online hardware threads, lowest first."""

    socket: int
    die: int
    node: int
    cpus: tuple[int, ...]
    type: str = PERFORMANCE  # one of CORE_TYPES; every core of a uniform CPU is PERFORMANCE

    @property
    def id(self) -> int:
        return self.cpus[0]


@dataclass(frozen=True)
class Node:
    id: int
    cpus: tuple[int, ...]
    memory_mb: int


@dataclass(frozen=True)
class CPUTopology:
    cores: tuple[Core, ...]
    nodes: tuple[Node, ...]
    allowed_cpus: CPUSet
    isa: tuple[str, ...]
    source: str
    warnings: tuple[str, ...] = ()  # what the reader left out or worked around, for the operator

    @property
    def core_types(self) -> tuple[str, ...]:
        """The types of core this machine has, fastest first."""
        present = {c.type for c in self.cores}
        return tuple(t for t in CORE_TYPES if t in present)

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({c.socket for c in self.cores}))

    @property
    def online_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(cpu for c in self.cores for cpu in c.cpus))

    @property
    def smt(self) -> bool:
        return any(len(c.cpus) > 1 for c in self.cores)

    def cores_in_node(self, node: int) -> tuple[Core, ...]:
        return tuple(c for c in self.cores if c.node == node)

    def to_json(self) -> dict:
        return {
            "sockets": len(self.sockets),
            "nodes": [
                {"id": n.id, "cpus": list(n.cpus), "memory_mb": n.memory_mb} for n in self.nodes
            ],
            "cores": [
                {"socket": c.socket, "node": c.node, "type": c.type, "cpus": list(c.cpus)}
                for c in self.cores
            ],
            "core_types": list(self.core_types),
            "allowed_cpus": self.allowed_cpus.to_plain(),
            "isa": list(self.isa),
            "warnings": list(self.warnings),
        }


def read_topology(
    sysfs_root: str | os.PathLike = LIVE_SYSFS,
    allowed_cpus: Iterable[int] | None = None,
    lscpu_text: str | None = None,
    allowed_mems: Iterable[int] | None = None,
) -> CPUTopology:
    """Read the topology under `sysfs_root`.

    `allowed_cpus` and `allowed_mems` (the nodes whose memory we may use) default to this
    process's affinity and its `Mems_allowed_list` on the live machine, and to everything for
    another root (a fixture describes another machine, whose cpuset we cannot know). CPUs that
    are not online, and the CPUs of nodes whose memory is not allowed, are left out with a
    warning. `lscpu_text` is `lscpu -p=CPU,CORE,SOCKET,NODE` output, used where per-CPU
    topology files are missing; on the live machine lscpu is run for it.
    """
    root = Path(sysfs_root)
    live = root.resolve() == LIVE_SYSFS
    cpu_dir = _cpu_dir(root)
    online = _online_cpus(cpu_dir)
    if not online:
        raise TopologyError(f"{cpu_dir}: no online CPUs found")
    warnings: list[str] = []
    node_dir = root / "devices" / "system" / "node"
    node_of, nodes = _read_nodes(node_dir, online)

    cores = _cores_from_sysfs(cpu_dir, online, warnings)
    source = "sysfs"
    if isinstance(cores, str):  # what is missing
        if lscpu_text is None:
            if not live:
                raise TopologyError(
                    f"{cpu_dir}: {cores}, and the lscpu fallback only describes the live machine"
                )
            lscpu_text = _run_lscpu()
        cores = cores_from_lscpu(lscpu_text, online)
        source = "lscpu"
    if node_of is not None:
        cores = _on_nodes(cores, node_of, node_dir, warnings)
    else:  # no NUMA in sysfs: nodes come from the cores (lscpu's, or node 0)
        nodes = _nodes_from_cores(cores, nodes)
    types = _core_types(root, cpu_dir, online)
    cores = tuple(replace(c, type=types.get(c.id, PERFORMANCE)) for c in cores)

    placeable = {cpu for c in cores for cpu in c.cpus}
    if allowed_cpus is None:
        allowed = set(os.sched_getaffinity(0)) if live else set(placeable)
    else:
        allowed = set(allowed_cpus)
    if unused := allowed - placeable:
        warnings.append(
            f"allowed CPUs {format_cpulist(unused)} are not online CPUs with a node (online: "
            f"{format_cpulist(online)}): left out"
        )
    if allowed_mems is None and live:
        allowed_mems = _mems_allowed()
    if allowed_mems is not None:
        allowed -= _barred_by_memory(nodes, allowed, set(allowed_mems), warnings)
    return CPUTopology(
        cores=cores,
        nodes=nodes,
        allowed_cpus=CPUSet(allowed & placeable),
        isa=detect_isa() if live else (),
        source=source,
        warnings=tuple(warnings),
    )


def _cpu_dir(root: Path) -> Path:
    """`root`'s cpu folder; a clear error for a tree that is not one, or its parent."""
    cpu_dir = root / "devices" / "system" / "cpu"
    if not cpu_dir.is_dir():
        if (root / "sys" / "devices" / "system" / "cpu").is_dir():
            raise TopologyError(
                f"{cpu_dir} does not exist, but {root / 'sys'} holds a sysfs tree: "
                f"pass {root / 'sys'} (the folder that stands for /sys)"
            )
        raise TopologyError(f"{cpu_dir} does not exist: is {root} a sysfs tree?")
    return cpu_dir


def _barred_by_memory(
    nodes: tuple[Node, ...], allowed: set[int], mems: set[int], warnings: list[str]
) -> set[int]:
    """The allowed CPUs of nodes whose memory this process may not use, each node warned of."""
    barred_all: set[int] = set()
    for node in nodes:
        barred = allowed & set(node.cpus)
        if node.id not in mems and barred:
            warnings.append(
                f"node {node.id}'s memory is not allowed to this process (allowed memory "
                f"nodes: {format_cpulist(mems) or 'none'}; cpuset.mems): its CPUs "
                f"{format_cpulist(barred)} are left out"
            )
            barred_all |= barred
    return barred_all


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip(BLANK)
    except (FileNotFoundError, NotADirectoryError):
        return None


MASK_FILES = {"cpumap", "core_cpus", "thread_siblings", "core_siblings", "package_cpus"}


def _cpuset(directory: Path, *names: str) -> list[int] | None:
    """The first of `names` that exists in `directory`, read as a list or, for MASK_FILES, a
    hex mask (older kernels and trimmed captures have only the masks)."""
    for name in names:
        text = _read(directory / name)
        if text is None:
            continue
        try:
            return parse_cpumask(text) if name in MASK_FILES else parse_cpulist(text)
        except CPUListError as e:
            raise TopologyError(f"{directory / name}: {e}") from None
    return None


def _numbered_dirs(parent: Path, prefix: str) -> list[int]:
    pattern = re.compile(rf"{prefix}(\d+)")
    if not parent.is_dir():
        return []
    return sorted(int(m.group(1)) for p in parent.iterdir() if (m := pattern.fullmatch(p.name)))


def _online_cpus(cpu_dir: Path) -> list[int]:
    """The `online` list, or, where that file is missing, each cpuN's own `online` flag."""
    listed = _cpuset(cpu_dir, "online")
    if listed is not None:
        return listed
    # cpu0 usually cannot be taken offline and then has no `online` file: it counts as online.
    return [
        n for n in _numbered_dirs(cpu_dir, "cpu") if _read(cpu_dir / f"cpu{n}" / "online") != "0"
    ]


def _read_nodes(
    node_dir: Path, online: list[int]
) -> tuple[dict[int, int] | None, tuple[Node, ...]]:
    """Each online CPU's node, and the nodes. The map is None where sysfs has no NUMA nodes.

    Firmware that gives one CPU to several nodes is refused: there is no telling which node's
    memory is local to it, and binding an instance to any one of them may confine it to a
    sliver of the machine's memory.
    """
    ids = _numbered_dirs(node_dir, "node")
    if not ids:
        return None, ()
    online_set = set(online)
    listed = {n: _cpuset(node_dir / f"node{n}", "cpulist", "cpumap") for n in ids}
    if all(cpus is None for cpus in listed.values()):
        if len(ids) > 1:
            raise TopologyError(
                f"{node_dir}: node{ids[0]}..node{ids[-1]} have neither cpulist nor cpumap, so "
                "which CPUs each node holds is unknown"
            )
        listed = {ids[0]: online}  # one node holds every CPU
    node_of: dict[int, int] = {}
    claims: dict[int, list[int]] = {}
    for n, cpus in listed.items():
        for c in cpus or ():
            if c in online_set:
                node_of[c] = n
                claims.setdefault(c, []).append(n)
    shared = {c: ns for c, ns in claims.items() if len(ns) > 1}
    if shared:
        nodes_named = sorted({n for ns in shared.values() for n in ns})
        raise TopologyError(
            f"the firmware gives CPUs {format_cpulist(shared)} to more than one NUMA node "
            f"(nodes {format_cpulist(nodes_named)} in {node_dir}/node*/cpulist): which node's "
            "memory is local to them is unknown. Fix the firmware's NUMA tables (SRAT), or "
            "boot with numa=off to run as one node"
        )
    nodes = tuple(
        Node(
            id=n,
            cpus=tuple(sorted(c for c in cpus or () if c in online_set)),
            memory_mb=_node_memory_mb(node_dir / f"node{n}"),
        )
        for n, cpus in listed.items()
    )
    return node_of, nodes


def _mems_allowed(status: Path = Path("/proc/self/status")) -> list[int] | None:
    """The nodes whose memory this process may use: its cpuset's `cpuset.mems.effective`, as
    the kernel applies it. None where the kernel does not say (no NUMA support)."""
    for line in (_read(status) or "").splitlines():
        if line.startswith("Mems_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    return None


def _node_memory_mb(node_path: Path) -> int:
    text = _read(node_path / "meminfo") or ""
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
    return int(m.group(1)) // 1024 if m else 0


def _on_nodes(
    cores: tuple[Core, ...], node_of: dict[int, int], node_dir: Path, warnings: list[str]
) -> tuple[Core, ...]:
    """Each core on the node sysfs gives its lowest thread. A core no node lists is left out:
    a node made up for it may not exist, and binding memory to it fails."""
    placed = tuple(replace(c, node=node_of[c.id]) for c in cores if c.id in node_of)
    orphans = [cpu for c in cores if c.id not in node_of for cpu in c.cpus]
    if orphans:
        warnings.append(
            f"online CPUs {format_cpulist(orphans)} are in no node's cpulist or cpumap under "
            f"{node_dir}: left out"
        )
    return placed


def _cores_from_sysfs(
    cpu_dir: Path, online: list[int], warnings: list[str]
) -> tuple[Core, ...] | str:
    """Group online CPUs into cores (on node 0 until _on_nodes places them), or say which
    topology files some online CPUs lack."""
    online_set = set(online)
    lacking = [
        cpu for cpu in online if _read(cpu_dir / f"cpu{cpu}" / "topology" / "core_id") is None
    ]
    if lacking:
        return f"CPUs {format_cpulist(lacking)} have no topology files (cpuN/topology/core_id)"
    socket_of = _sockets(cpu_dir, online, warnings)
    by_key: dict[tuple, list[int]] = {}
    where: dict[tuple, tuple[int, int]] = {}
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        die = max(0, int(_read(topo / "die_id") or 0))
        siblings = _cpuset(
            topo, "core_cpus_list", "core_cpus", "thread_siblings_list", "thread_siblings"
        )
        # The kernel's sibling set is the authority; (socket, die, core_id) is the fallback
        # key, never core_id alone. Offline siblings (SMT off at runtime) are dropped.
        key: tuple
        if siblings is not None:
            key = ("siblings", min([c for c in siblings if c in online_set] or [cpu]))
        else:
            key = ("id", socket_of[cpu], die, int(_read(topo / "core_id") or 0))
        by_key.setdefault(key, []).append(cpu)
        where[key] = (socket_of[cpu], die)
    cores = [
        Core(socket=where[k][0], die=where[k][1], node=0, cpus=tuple(sorted(cpus)))
        for k, cpus in by_key.items()
    ]
    return tuple(sorted(cores, key=lambda c: c.id))


def _sockets(cpu_dir: Path, online: list[int], warnings: list[str]) -> dict[int, int]:
    """Each CPU's socket: `physical_package_id` where it is set and agrees with the package
    CPU sets; else the packages those sets describe, numbered from 0 in CPU order (s390, SPARC
    and some hypervisors report -1)."""
    online_set = set(online)
    ids: dict[int, int] = {}
    groups: dict[int, int] = {}  # CPU -> the lowest online CPU of its package
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        ids[cpu] = int(_read(topo / "physical_package_id") or -1)
        package = _cpuset(
            topo, "package_cpus_list", "package_cpus", "core_siblings_list", "core_siblings"
        )
        if package is not None:
            groups[cpu] = min([c for c in package if c in online_set] or [cpu])
    have_ids = all(i >= 0 for i in ids.values())
    if len(groups) < len(online):
        if not have_ids:
            warnings.append(
                "no socket ids (physical_package_id is -1 and no package CPU sets): "
                "counted as one socket"
            )
            return {cpu: 0 for cpu in online}
        return ids
    per_group: dict[int, set[int]] = {}
    for cpu, group in groups.items():
        per_group.setdefault(group, set()).add(ids[cpu])
    agree = have_ids and all(len(v) == 1 for v in per_group.values())
    if agree and len({min(v) for v in per_group.values()}) == len(per_group):
        return ids
    if have_ids:
        warnings.append(
            "physical_package_id contradicts the package CPU sets (package_cpus_list, "
            "core_siblings_list): sockets counted from the sets"
        )
    number = {group: i for i, group in enumerate(sorted(per_group))}
    return {cpu: number[group] for cpu, group in groups.items()}


def _core_types(root: Path, cpu_dir: Path, online: list[int]) -> dict[int, str]:
    """Each CPU's core type where the machine is hybrid: Intel lists its P- and E-cores under
    devices/cpu_core and devices/cpu_atom; ARM ranks cores by `cpu_capacity` (1024 for the
    fastest). Empty for a uniform machine."""
    performance = _cpuset(root / "devices" / "cpu_core", "cpus")
    efficiency = _cpuset(root / "devices" / "cpu_atom", "cpus")
    if performance is not None and efficiency is not None:
        return {c: PERFORMANCE for c in performance} | {c: EFFICIENCY for c in efficiency}
    capacity = {}
    for cpu in online:
        text = _read(cpu_dir / f"cpu{cpu}" / "cpu_capacity")
        if text is not None and text.isdigit():
            capacity[cpu] = int(text)
    ranks = sorted(set(capacity.values()), reverse=True)
    if len(ranks) < 2:
        return {}
    names = [PERFORMANCE, *[MID] * (len(ranks) - 2), EFFICIENCY]
    return {cpu: names[ranks.index(cap)] for cpu, cap in capacity.items()}


def _run_lscpu() -> str:
    try:
        return subprocess.run(
            ["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise TopologyError(f"sysfs topology is incomplete and lscpu failed: {e}") from None


def cores_from_lscpu(text: str, online: Iterable[int]) -> tuple[Core, ...]:
    """Parse `lscpu -p=CPU,CORE,SOCKET,NODE`. Its Core column is unique machine-wide."""
    online_set = set(online)
    groups: dict[int, list[tuple[int, int, int]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        if len(fields) < 4:
            raise TopologyError(f"lscpu -p: expected CPU,CORE,SOCKET,NODE, got {line!r}")
        try:
            cpu, core, socket = int(fields[0]), int(fields[1]), int(fields[2])
            node = int(fields[3]) if fields[3] else 0
        except ValueError:
            raise TopologyError(f"lscpu -p: not numbers: {line!r}") from None
        if cpu in online_set:
            groups.setdefault(core, []).append((cpu, socket, node))
    cores = []
    for members in groups.values():
        members.sort()
        _, socket, node = members[0]
        cores.append(Core(socket=socket, die=0, node=node, cpus=tuple(m[0] for m in members)))
    if not cores:
        raise TopologyError("lscpu -p listed none of the online CPUs")
    return tuple(sorted(cores, key=lambda c: c.id))


def _nodes_from_cores(cores: tuple[Core, ...], known: tuple[Node, ...]) -> tuple[Node, ...]:
    memory = {n.id: n.memory_mb for n in known}
    ids = sorted({c.node for c in cores} | set(memory))
    return tuple(
        Node(
            id=n,
            cpus=tuple(sorted(cpu for c in cores if c.node == n for cpu in c.cpus)),
            memory_mb=memory.get(n, 0),
        )
        for n in ids
    )


def format_topology(topo: CPUTopology) -> str:
    """A table a person reads: one row per NUMA node."""
    threads = max(len(c.cpus) for c in topo.cores)
    lines = [
        f"sockets: {len(topo.sockets)}   nodes: {len(topo.nodes)}   physical cores: "
        f"{len(topo.cores)}   threads per core: {threads}   online CPUs: {len(topo.online_cpus)}",
        f"allowed CPUs: {topo.allowed_cpus or '-'}",
        f"ISA: {' '.join(topo.isa) or '-'}   (read from {topo.source})",
        "",
        f"{'node':>4}  {'socket':>6}  {'cores':>5}  {'memory':>10}  cpus",
    ]
    for n in topo.nodes:
        cores = topo.cores_in_node(n.id)
        sockets = ",".join(str(s) for s in sorted({c.socket for c in cores})) or "-"
        mem = f"{n.memory_mb} MB" if n.memory_mb else "-"
        kind = format_cpulist(n.cpus) or "(memory only)"
        lines.append(f"{n.id:>4}  {sockets:>6}  {len(cores):>5}  {mem:>10}  {kind}")
    if len(topo.core_types) > 1:  # a hybrid CPU: which cores are which
        lines.append("")
        for kind in topo.core_types:
            of_kind = [c for c in topo.cores if c.type == kind]
            cpus = format_cpulist(cpu for c in of_kind for cpu in c.cpus)
            lines.append(f"{kind} cores: {len(of_kind)}  cpus {cpus}")
    lines += [f"warning: {w}" for w in topo.warnings]
    return "\n".join(lines)
