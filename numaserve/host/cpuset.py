"""A set of CPUs as one immutable value (after kubelet's `cpuset.CPUSet`): parsed from and
printed in the kernel's list format ("0-3,8"), combined by union, intersection and
difference, and read against a machine's topology (the whole cores under it, its nodes).

"The whole cores under these CPUs" is what a plan holds in the core ledger and what a
placement leaves out around another server's instances: an SMT sibling of a core in use is
never given to anyone else."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaserve.host.cpulist import format_cpulist, parse_cpulist

if TYPE_CHECKING:
    from numaserve.host.topology import CPUTopology


@dataclass(frozen=True)
class CPUSet:
    cpus: frozenset[int] = frozenset()

    @classmethod
    def of(cls, cpus: Iterable[int]) -> CPUSet:
        return cls(frozenset(cpus))

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """The kernel's list format: "0-3,8"; "" is the empty set. CPUListError otherwise."""
        return cls(frozenset(parse_cpulist(text)))

    def __str__(self) -> str:
        return format_cpulist(self.cpus)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.cpus))

    def __len__(self) -> int:
        return len(self.cpus)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self.cpus

    def __or__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.cpus | other.cpus)

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.cpus & other.cpus)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.cpus - other.cpus)

    def sorted(self) -> tuple[int, ...]:
        """Ascending, as the records that hold CPUs hold them."""
        return tuple(sorted(self.cpus))

    def whole_cores(self, topo: CPUTopology) -> CPUSet:
        """Every thread of each physical core any of these CPUs is a thread of."""
        return CPUSet.of(
            cpu for core in topo.cores if self.cpus & set(core.cpus) for cpu in core.cpus
        )

    def nodes(self, topo: CPUTopology) -> tuple[int, ...]:
        """The NUMA nodes these CPUs are on, ascending."""
        return tuple(sorted({core.node for core in topo.cores if self.cpus & set(core.cpus)}))
