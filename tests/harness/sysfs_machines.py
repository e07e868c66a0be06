"""Machines described as data, written out as sysfs trees the way Linux lays them out.

`python -m tests.harness.sysfs_machines` regenerates the committed trees in tests/fixtures/sysfs/,
each named after the real machine whose numbering it copies. The property tests write
random machines the same way and check that the reader recovers them.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numaserve.host.cpulist import format_cpulist

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sysfs"


@dataclass(frozen=True)
class Cpu:
    id: int
    package: int
    die: int
    core_id: int
    node: int
    online: bool = True
    type: str = "performance"  # the core type the reader should report
    capacity: int | None = None  # ARM's cpu_capacity, where the machine has one


@dataclass
class Machine:
    name: str
    cpus: list[Cpu]
    node_memory_mb: dict[int, int]  # every node, memory-only ones included
    online_file: bool = True
    smt_control: str = "on"
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    lists: bool = True  # the *_list files; older kernels and trimmed captures lack them
    masks: bool = False  # the hex masks (cpumap, thread_siblings, core_siblings, ...)
    package_ids: bool = True  # False: physical_package_id is -1 (s390, SPARC, hypervisors)
    node_cpus: dict[int, list[int]] | None = None  # what nodeN/cpulist says, where firmware lies
    intel_hybrid: bool = False  # devices/cpu_core/cpus and devices/cpu_atom/cpus
    end: str = "\n"  # how each file ends: a 5.15 kernel was seen ending masks with a NUL byte

    def siblings(self, cpu: Cpu) -> list[int]:
        return sorted(
            c.id
            for c in self.cpus
            if (c.package, c.die, c.core_id) == (cpu.package, cpu.die, cpu.core_id)
        )

    def expected_cores(self) -> list[tuple[int, ...]]:
        """Online threads of each core that has one, lowest thread first."""
        groups: dict[tuple, list[int]] = {}
        for c in self.cpus:
            if c.online:
                groups.setdefault((c.package, c.die, c.core_id), []).append(c.id)
        return sorted(tuple(sorted(v)) for v in groups.values())

    def package_cpus(self, cpu: Cpu) -> list[int]:
        return sorted(c.id for c in self.cpus if c.package == cpu.package)

    def _cpuset(self, directory: Path, name: str, mask_name: str, cpus) -> None:
        if self.lists:
            _write(directory / name, format_cpulist(cpus), self.end)
        if self.masks:
            _write(directory / mask_name, _mask(cpus, len(self.cpus)), self.end)

    def write(self, root: Path) -> Path:
        cpu_dir = root / "devices" / "system" / "cpu"
        node_dir = root / "devices" / "system" / "node"
        cpu_dir.mkdir(parents=True, exist_ok=True)
        node_dir.mkdir(parents=True, exist_ok=True)
        all_ids = [c.id for c in self.cpus]
        online = [c.id for c in self.cpus if c.online]
        _write(cpu_dir / "possible", format_cpulist(all_ids))
        _write(cpu_dir / "present", format_cpulist(all_ids))
        if self.online_file:
            _write(cpu_dir / "online", format_cpulist(online))
        _write(cpu_dir / "offline", format_cpulist(set(all_ids) - set(online)))
        _write(cpu_dir / "smt" / "control", self.smt_control)
        for c in self.cpus:
            self._write_cpu(cpu_dir, c)
        if self.intel_hybrid:
            for pmu, kind in (("cpu_core", "performance"), ("cpu_atom", "efficiency")):
                cpus = [c.id for c in self.cpus if c.type == kind]
                _write(root / "devices" / pmu / "cpus", format_cpulist(cpus))
        self._write_nodes(node_dir)
        for rel, text in self.extra.items():
            _write(root / rel, text)
        return root

    def _write_cpu(self, cpu_dir: Path, c: Cpu) -> None:
        d = cpu_dir / f"cpu{c.id}"
        d.mkdir(exist_ok=True)
        if c.id != 0:  # the boot CPU has no online switch
            _write(d / "online", "1" if c.online else "0")
        if not c.online:
            return  # the kernel removes topology/ while a CPU is offline
        t = d / "topology"
        _write(t / "physical_package_id", str(c.package if self.package_ids else -1))
        _write(t / "die_id", str(c.die))
        _write(t / "core_id", str(c.core_id))
        for name in ("core_cpus", "thread_siblings"):
            self._cpuset(t, f"{name}_list", name, self.siblings(c))
        for name in ("package_cpus", "core_siblings"):
            self._cpuset(t, f"{name}_list", name, self.package_cpus(c))
        if c.capacity is not None:
            _write(d / "cpu_capacity", str(c.capacity))

    def _write_nodes(self, node_dir: Path) -> None:
        nodes = sorted(self.node_memory_mb)
        _write(node_dir / "possible", format_cpulist(nodes))
        _write(node_dir / "online", format_cpulist(nodes))
        _write(node_dir / "has_cpu", format_cpulist({c.node for c in self.cpus if c.online}))
        _write(node_dir / "has_memory", format_cpulist(n for n in nodes if self.node_memory_mb[n]))
        for n in nodes:
            cpus = [c.id for c in self.cpus if c.node == n]
            if self.node_cpus is not None:
                cpus = self.node_cpus.get(n, [])
            self._cpuset(node_dir / f"node{n}", "cpulist", "cpumap", cpus)
            kb = self.node_memory_mb[n] * 1024
            _write(
                node_dir / f"node{n}" / "meminfo",
                f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        {kb // 2} kB\n",
            )


def _write(path: Path, text: str, end: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + ("" if text.endswith("\n") else end))


def _mask(cpus, nr_cpus: int) -> str:
    """The kernel's hex mask: 32-bit words, most significant first, comma-separated."""
    bits = sum(1 << c for c in cpus)
    words = max(1, (nr_cpus + 31) // 32)
    return ",".join(f"{bits >> (32 * w) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))


def xeon8260_2socket() -> Machine:
    """2x Xeon Platinum 8260, 24 cores each, HT on: 0-23,48-71 on node 0; 24-47,72-95 on node 1.

    Cascade Lake core_ids are sparse (0-5, 8-13, 16-21, 24-29) and repeat in each package.
    """
    core_ids = [b + k for b in (0, 8, 16, 24) for k in range(6)]
    cpus = [
        Cpu(id=t * 48 + s * 24 + i, package=s, die=0, core_id=core_ids[i], node=s)
        for t in range(2)
        for s in range(2)
        for i in range(24)
    ]
    return Machine("xeon8260_2socket", cpus, {0: 196608, 1: 196608})


def epyc7402_2socket_nps4() -> Machine:
    """2x EPYC 7402 (24 cores, 8 CCX of 3) in NPS4: 4 nodes of 6 cores per socket."""
    cpus = [
        Cpu(
            id=t * 48 + s * 24 + i,
            package=s,
            die=0,
            core_id=(i // 3) * 4 + i % 3,
            node=s * 4 + i // 6,
        )
        for t in range(2)
        for s in range(2)
        for i in range(24)
    ]
    return Machine("epyc7402_2socket_nps4", cpus, {n: 32768 for n in range(8)})


def xeon6980p_snc3() -> Machine:
    """Xeon 6980P, 128 cores, HT on, SNC3: three sub-NUMA nodes of 43, 43 and 42 cores."""
    cpus = [
        Cpu(id=t * 128 + i, package=0, die=i // 43, core_id=i, node=min(i // 43, 2))
        for t in range(2)
        for i in range(128)
    ]
    return Machine("xeon6980p_snc3", cpus, {0: 262144, 1: 262144, 2: 253952})


def xeon_e2288g_smt_off() -> Machine:
    """Xeon E-2288G, 8 cores, booted with `nosmt`: siblings 8-15 exist but are offline."""
    cpus = [
        Cpu(id=t * 8 + i, package=0, die=0, core_id=i, node=0, online=t == 0)
        for t in range(2)
        for i in range(8)
    ]
    return Machine("xeon_e2288g_smt_off", cpus, {0: 65536}, smt_control="off")


def xeon8380_cxl_offline() -> Machine:
    """Xeon Platinum 8380 (40 cores, HT) with a CXL memory expander as memory-only node 1.

    Cores 38 and 39 are offline entirely (CPUs 38, 39, 78, 79), and CPU 50, the sibling of
    CPU 10, is offline alone.
    """
    offline = {38, 39, 78, 79, 50}
    cpus = [
        Cpu(id=t * 40 + i, package=0, die=0, core_id=i, node=0, online=(t * 40 + i) not in offline)
        for t in range(2)
        for i in range(40)
    ]
    return Machine("xeon8380_cxl_offline", cpus, {0: 524288, 1: 131072})


def xeon_e5_2690v4_interleaved() -> Machine:
    """2x Xeon E5-2690 v4 (14 cores, HT) whose firmware numbers CPUs alternately by socket."""
    core_ids = [*range(7), *range(8, 15)]
    cpus = [
        Cpu(id=2 * (t * 14 + i) + s, package=s, die=0, core_id=core_ids[i], node=s)
        for t in range(2)
        for i in range(14)
        for s in range(2)
    ]
    return Machine("xeon_e5_2690v4_interleaved", cpus, {0: 131072, 1: 131072})


def epyc7451_2socket_cpumap() -> Machine:
    """2x EPYC 7451 (Naples: 4 dies of 6 cores per socket, each die a node: 8 nodes), SMT on,
    captured from a kernel that writes only the hex masks (no cpulist, no *_list files)."""
    cpus = [
        Cpu(
            id=t * 48 + s * 24 + i,
            package=s,
            die=0,
            core_id=(i // 6) * 8 + (i % 6) // 3 * 4 + i % 3,
            node=s * 4 + i // 6,
        )
        for t in range(2)
        for s in range(2)
        for i in range(24)
    ]
    return Machine(
        "epyc7451_2socket_cpumap", cpus, {n: 16384 for n in range(8)}, lists=False, masks=True
    )


def graviton2_nul() -> Machine:
    """AWS Graviton2 (64 Neoverse N1 cores, no SMT, one node) on a 5.15 kernel whose CPU set
    files end with a NUL byte, masks and lists alike."""
    cpus = [Cpu(id=i, package=0, die=0, core_id=i, node=0) for i in range(64)]
    return Machine("graviton2_nul", cpus, {0: 131072}, masks=True, end="\n\x00")


def i7_1370p_hybrid() -> Machine:
    """Core i7-1370P laptop: 6 P-cores with HT (CPUs 0-11, siblings adjacent) and 8 E-cores
    (CPUs 12-19), one node; the kernel lists each type under devices/cpu_core, cpu_atom."""
    cpus = [Cpu(id=i, package=0, die=0, core_id=4 * (i // 2), node=0) for i in range(12)]
    cpus += [
        Cpu(id=12 + i, package=0, die=0, core_id=24 + i, node=0, type="efficiency")
        for i in range(8)
    ]
    return Machine("i7_1370p_hybrid", cpus, {0: 32768}, intel_hybrid=True)


def rk3588_big_little() -> Machine:
    """Rockchip RK3588: 4 Cortex-A55 (CPUs 0-3, cpu_capacity 530) and 4 Cortex-A76 (CPUs 4-7,
    1024), no SMT, one node."""
    cpus = [
        Cpu(
            id=i,
            package=0,
            die=0,
            core_id=i,
            node=0,
            type="efficiency" if i < 4 else "performance",
            capacity=530 if i < 4 else 1024,
        )
        for i in range(8)
    ]
    return Machine("rk3588_big_little", cpus, {0: 16384})


def duplicated_nodes_firmware() -> Machine:
    """A 16 GiB, 8-core SMT server whose firmware reports 8 nodes of 2 GiB, each claiming all
    16 CPUs."""
    cpus = [
        Cpu(id=t * 8 + i, package=0, die=0, core_id=i, node=0) for t in range(2) for i in range(8)
    ]
    return Machine(
        "duplicated_nodes_firmware",
        cpus,
        {n: 2048 for n in range(8)},
        node_cpus={n: list(range(16)) for n in range(8)},
    )


def s390_z15_lpar() -> Machine:
    """IBM z15 LPAR: 2 sockets (as the package CPU sets tell) of 4 cores with SMT-2, one node;
    physical_package_id reads -1."""
    cpus = [
        Cpu(id=s * 8 + i * 2 + t, package=s, die=0, core_id=s * 4 + i, node=0)
        for s in range(2)
        for i in range(4)
        for t in range(2)
    ]
    return Machine("s390_z15_lpar", cpus, {0: 65536}, package_ids=False)


def node0_offline() -> Machine:
    """A 2-socket host (8 cores with HT per socket) whose node 0 is offline (its memory failed
    at boot): node1 lists its CPUs 16-31, and CPUs 0-15, online, are in no node."""
    cpus = [
        Cpu(id=s * 16 + t * 8 + i, package=s, die=0, core_id=i, node=s)
        for s in range(2)
        for t in range(2)
        for i in range(8)
    ]
    return Machine("node0_offline", cpus, {1: 32768}, node_cpus={1: list(range(16, 32))})


NAMED = [
    xeon8260_2socket,
    epyc7402_2socket_nps4,
    xeon6980p_snc3,
    xeon_e2288g_smt_off,
    xeon8380_cxl_offline,
    xeon_e5_2690v4_interleaved,
    epyc7451_2socket_cpumap,
    graviton2_nul,
    i7_1370p_hybrid,
    rk3588_big_little,
    duplicated_nodes_firmware,
    s390_z15_lpar,
    node0_offline,
]


def regenerate() -> None:
    for make in NAMED:
        m = make()
        target = FIXTURES / m.name
        shutil.rmtree(target, ignore_errors=True)
        m.write(target)
        print(f"wrote {target}")


if __name__ == "__main__":
    regenerate()
