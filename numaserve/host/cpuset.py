"""A set of CPUs as one immutable value (after kubelet's `cpuset.CPUSet`): parsed from and
printed in the kernel's list format ("0-3,8"), combined by union, intersection and
difference, and read against a machine's topology (the whole cores under it, its nodes).
NUMA nodes are sets of the same kind (cgroup's `cpuset.mems` is the same list format).

"The whole cores under these CPUs" is what a plan holds in the core ledger and what a
placement leaves out around another server's instances: an SMT sibling of a core in use is
never given to anyone else.

`Binding` is where a process runs: its CPUs and the nodes its memory is bound to, the one
record every plan, spec, report and status line holds for it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from numaserve.host.cpulist import format_cpulist, parse_cpulist


class _Core(Protocol):
    @property
    def cpus(self) -> tuple[int, ...]: ...

    @property
    def node(self) -> int: ...


class CPUTopology(Protocol):
    """What a set is read against: topology.CPUTopology (which holds CPUSets itself)."""

    @property
    def cores(self) -> Sequence[_Core]: ...


class CPUSet:
    """Immutable. On the wire (JSON specs, reports, status) a list of ints, ascending."""

    __slots__ = ("_ids",)
    _ids: frozenset[int]

    def __init__(self, ids: Iterable[int] = ()):
        if isinstance(ids, str):  # its characters would be taken for members
            raise TypeError(f"CPUSet({ids!r}): CPUSet.parse reads the list format")
        object.__setattr__(self, "_ids", frozenset(ids))

    @classmethod
    def of(cls, ids: Iterable[int]) -> CPUSet:
        return cls(ids)

    @classmethod
    def union(cls, sets: Iterable[CPUSet]) -> CPUSet:
        """Every member of any of them: the CPUs of a plan's slots, of the ledger's holders."""
        return cls(i for s in sets for i in s._ids)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """The kernel's list format: "0-3,8"; "" is the empty set. CPUListError otherwise."""
        return cls(parse_cpulist(text))

    @classmethod
    def from_plain(cls, value: Any) -> CPUSet:
        """Its wire form back: a list of non-negative ints. ValueError for anything else."""
        if not isinstance(value, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
        ):
            raise ValueError(f"expected a list of CPU or node numbers, got {value!r}")
        return cls(value)

    def to_plain(self) -> list[int]:
        return sorted(self._ids)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a CPUSet is immutable")

    def __reduce__(self):  # pickle and copy: immutable, rebuilt from its members
        return (CPUSet, (tuple(self),))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUSet) and self._ids == other._ids

    def __hash__(self) -> int:
        return hash(self._ids)

    def __repr__(self) -> str:
        return f"CPUSet({str(self)!r})"

    def __str__(self) -> str:
        return format_cpulist(self._ids)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._ids))

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._ids

    def __or__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self._ids | other._ids)

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self._ids & other._ids)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self._ids - other._ids)

    @property
    def ids(self) -> frozenset[int]:
        return self._ids

    def sorted(self) -> tuple[int, ...]:
        return tuple(sorted(self._ids))

    def whole_cores(self, topo: CPUTopology) -> CPUSet:
        """Every thread of each physical core any of these CPUs is a thread of."""
        return CPUSet(cpu for core in topo.cores if self._ids & set(core.cpus) for cpu in core.cpus)

    def nodes(self, topo: CPUTopology) -> CPUSet:
        """The NUMA nodes these CPUs are on."""
        return CPUSet(core.node for core in topo.cores if self._ids & set(core.cpus))


@dataclass(frozen=True)
class Binding:
    """Where a process runs: the CPUs it is pinned to and the NUMA nodes its memory is bound
    to. No CPUs: not pinned (a plan with no reserved cores leaves its router shards so)."""

    cpus: CPUSet = CPUSet()
    nodes: CPUSet = CPUSet()

    @classmethod
    def on(cls, cpus: Iterable[int], topo: CPUTopology) -> Binding:
        """CPUs, with the nodes the topology puts them on."""
        cpus = CPUSet(cpus)
        return cls(cpus, cpus.nodes(topo))

    @classmethod
    def of(cls, cpus: Iterable[int], nodes: Iterable[int]) -> Binding:
        return cls(CPUSet(cpus), CPUSet(nodes))

    def __bool__(self) -> bool:
        return bool(self.cpus)

    def __str__(self) -> str:
        """As the logs say it: "CPUs 0-3, node(s) 0"."""
        return f"CPUs {self.cpus}, node(s) {self.nodes}" if self.cpus else "not pinned"

    @property
    def node(self) -> int | None:
        """The one node holding every CPU, or None (several, or not pinned)."""
        return next(iter(self.nodes)) if len(self.nodes) == 1 else None

    def to_plain(self) -> dict[str, list[int]]:
        return {"cpus": self.cpus.to_plain(), "nodes": self.nodes.to_plain()}


def plain(value: Any) -> Any:
    """json.dumps's `default`: a CPUSet or Binding as its wire form."""
    if isinstance(value, CPUSet | Binding):
        return value.to_plain()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
