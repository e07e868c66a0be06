"""CPU topology read from Linux sysfs (or `lscpu -p` where sysfs is incomplete).

Everything is read under a root that stands in for `/sys`, so tests and `--sysfs-root` can
describe machines other than this one. A physical core is identified by its lowest online
thread id; `core_id` alone is not unique (it repeats across packages and is often sparse).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from numaserve.host.cpulist import CPUListError, format_cpulist, parse_cpulist

LIVE_SYSFS = Path("/sys")

# ISA extensions that decide how fast int8/bf16 transformer kernels run.
INTERESTING_ISA = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


class TopologyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Core:
    """One physical core: its online hardware threads, lowest first."""

    socket: int
    die: int
    node: int
    cpus: tuple[int, ...]

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
    allowed_cpus: frozenset[int]
    isa: tuple[str, ...]
    source: str

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
                {"socket": c.socket, "node": c.node, "cpus": list(c.cpus)} for c in self.cores
            ],
            "allowed_cpus": sorted(self.allowed_cpus),
            "isa": list(self.isa),
        }


def read_topology(
    sysfs_root: str | os.PathLike = LIVE_SYSFS,
    allowed_cpus: Iterable[int] | None = None,
    lscpu_text: str | None = None,
) -> CPUTopology:
    """Read the topology under `sysfs_root`.

    `allowed_cpus` defaults to this process's affinity on the live machine, and to every online
    CPU for another root (a fixture describes another machine, whose cpuset we cannot know).
    `lscpu_text` is `lscpu -p=CPU,CORE,SOCKET,NODE` output, used where per-CPU topology files
    are missing; on the live machine lscpu is run for it.
    """
    root = Path(sysfs_root)
    live = root.resolve() == LIVE_SYSFS
    cpu_dir = root / "devices" / "system" / "cpu"
    if not cpu_dir.is_dir():
        raise TopologyError(f"{cpu_dir} does not exist: is {root} a sysfs tree?")
    online = _online_cpus(cpu_dir)
    if not online:
        raise TopologyError(f"{cpu_dir}: no online CPUs found")
    node_of, nodes = _read_nodes(root / "devices" / "system" / "node", online)

    cores = _cores_from_sysfs(cpu_dir, online, node_of)
    source = "sysfs"
    if cores is None:
        if lscpu_text is None:
            if not live:
                raise TopologyError(
                    f"{cpu_dir}: some online CPUs have no topology files, and the lscpu "
                    "fallback only describes the live machine"
                )
            lscpu_text = _run_lscpu()
        cores = cores_from_lscpu(lscpu_text, online)
        source = "lscpu"
    if not any(n.cpus for n in nodes):  # no NUMA in sysfs: nodes come from the cores
        nodes = _nodes_from_cores(cores, nodes)

    if allowed_cpus is None:
        allowed = set(os.sched_getaffinity(0)) if live else set(online)
    else:
        allowed = set(allowed_cpus)
        unknown = allowed - set(online)
        if unknown:
            raise TopologyError(
                f"allowed CPUs {format_cpulist(unknown)} are not online CPUs of this machine "
                f"(online: {format_cpulist(online)})"
            )
    return CPUTopology(
        cores=cores,
        nodes=nodes,
        allowed_cpus=frozenset(allowed & set(online)),
        isa=detect_isa() if live else (),
        source=source,
    )


def detect_isa() -> tuple[str, ...]:
    import cpuinfo  # py-cpuinfo; imported late because it is slow to start

    flags = set(cpuinfo.get_cpu_info().get("flags", ()))
    return tuple(f for f in INTERESTING_ISA if f in flags)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _cpulist_file(path: Path) -> list[int] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except CPUListError as e:
        raise TopologyError(f"{path}: {e}") from None


def _numbered_dirs(parent: Path, prefix: str) -> list[int]:
    pattern = re.compile(rf"{prefix}(\d+)")
    if not parent.is_dir():
        return []
    return sorted(int(m.group(1)) for p in parent.iterdir() if (m := pattern.fullmatch(p.name)))


def _online_cpus(cpu_dir: Path) -> list[int]:
    """The `online` list, or, where that file is missing, each cpuN's own `online` flag."""
    listed = _cpulist_file(cpu_dir / "online")
    if listed is not None:
        return listed
    # cpu0 usually cannot be taken offline and then has no `online` file: it counts as online.
    return [
        n for n in _numbered_dirs(cpu_dir, "cpu") if _read(cpu_dir / f"cpu{n}" / "online") != "0"
    ]


def _read_nodes(node_dir: Path, online: list[int]) -> tuple[dict[int, int], tuple[Node, ...]]:
    online_set = set(online)
    node_of: dict[int, int] = {}
    nodes = []
    for n in _numbered_dirs(node_dir, "node"):
        cpus = [
            c for c in (_cpulist_file(node_dir / f"node{n}" / "cpulist") or []) if c in online_set
        ]
        for c in cpus:
            node_of[c] = n
        nodes.append(Node(id=n, cpus=tuple(cpus), memory_mb=_node_memory_mb(node_dir / f"node{n}")))
    return node_of, tuple(nodes)


def _node_memory_mb(node_path: Path) -> int:
    text = _read(node_path / "meminfo") or ""
    m = re.search(r"MemTotal:\s+(\d+)\s*kB", text)
    return int(m.group(1)) // 1024 if m else 0


def _cores_from_sysfs(
    cpu_dir: Path, online: list[int], node_of: dict[int, int]
) -> tuple[Core, ...] | None:
    """Group online CPUs into cores; None if any online CPU lacks its topology files."""
    online_set = set(online)
    by_key: dict[tuple, list[int]] = {}
    where: dict[tuple, tuple[int, int]] = {}
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        package, core_id = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if package is None or core_id is None:
            return None
        die = int(_read(topo / "die_id") or 0)
        siblings = _cpulist_file(topo / "core_cpus_list")
        if siblings is None:
            siblings = _cpulist_file(topo / "thread_siblings_list")
        # The kernel's sibling list is the authority; (package, die, core_id) is the fallback
        # key, never core_id alone. Offline siblings (SMT off at runtime) are dropped.
        key: tuple
        if siblings is not None:
            key = ("siblings", min([c for c in siblings if c in online_set] or [cpu]))
        else:
            key = ("id", int(package), die, int(core_id))
        by_key.setdefault(key, []).append(cpu)
        where[key] = (int(package), die)
    cores = [
        Core(
            socket=where[k][0],
            die=where[k][1],
            node=node_of.get(min(cpus), 0),
            cpus=tuple(sorted(cpus)),
        )
        for k, cpus in by_key.items()
    ]
    return tuple(sorted(cores, key=lambda c: c.id))


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
        f"allowed CPUs: {format_cpulist(topo.allowed_cpus) or '-'}",
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
    return "\n".join(lines)
