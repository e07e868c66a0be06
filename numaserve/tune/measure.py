"""Measure the model's curves: a probe process (probe.py) per model path and cores per
instance, placed by the planner itself on the cores other servers leave (the ledger), so each
runs where and as an instance would; several at once where the cores allow. Every probe is
stopped on any exit, and its cores are in the ledger while it runs."""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import tempfile
import time
import typing
from dataclasses import dataclass

from numaserve.config.schema import ModelConfig, PlacementConfig, PoolConfig
from numaserve.host.cpuset import CPUSet
from numaserve.host.ledger import Ledger, plan_around
from numaserve.host.placement import PlacementError, Slot
from numaserve.host.topology import CPUTopology
from numaserve.tune.curves import Cell, Curves
from numaserve.tune.probe import ProbeSpec

log = logging.getLogger("numaserve.tune")
LOAD_SLACK_S = 120.0  # beyond its budget, what a probe may take to start and load its model


class MeasureError(RuntimeError):
    """The model could not be measured here: no cores, or a probe that failed."""


@dataclass(frozen=True)
class Job:
    path: str
    model: ModelConfig  # its backend and precision named
    cores: int


def rounds(
    jobs: list[Job], topo: CPUTopology, ledger: Ledger | None
) -> list[list[tuple[Job, Slot]]]:
    """The jobs in rounds, each round's on cores of its own (planned as instances are, around
    the ledger), the widest first. A job that fits nowhere alone is a MeasureError."""
    waiting = sorted(jobs, key=lambda j: -j.cores)
    out: list[list[tuple[Job, Slot]]] = []
    while waiting:
        placed: list[tuple[Job, Slot]] = []
        for job in list(waiting):
            together = [j for j, _ in placed] + [job]
            slots = _place(together, topo, ledger)
            if slots is not None:
                placed = list(zip(together, slots, strict=True))
                waiting.remove(job)
        if not placed:
            raise MeasureError(_why_not(waiting[0], topo, ledger))
        out.append(placed)
    return out


def _placement(jobs: list[Job]) -> PlacementConfig:
    pools = tuple(
        PoolConfig(name=f"probe{i}", max_tokens=i + 1, cores_per_instance=j.cores, instances=1)
        for i, j in enumerate(jobs)
    )
    return PlacementConfig(pools=pools)


def _place(jobs: list[Job], topo: CPUTopology, ledger: Ledger | None) -> list[Slot] | None:
    """Each job's slot, in the jobs' order (pool `probe{i}` is job i's), or None: no fit."""
    try:
        _, plan, _ = plan_around(ledger, topo, _placement(jobs))
    except PlacementError:
        return None
    by_pool = {slot.pool: slot for slot in plan.slots}
    return [by_pool[f"probe{i}"] for i in range(len(jobs))]


def _why_not(job: Job, topo: CPUTopology, ledger: Ledger | None) -> str:
    try:
        plan_around(ledger, topo, _placement([job]))
    except PlacementError as e:
        return f"cannot measure {job.path} on {job.cores} core(s): {e}"
    return f"cannot measure {job.path} on {job.cores} core(s)"  # pragma: no cover


class Probes:
    """One round's probe processes; `stop` ends every one still running."""

    def __init__(self) -> None:
        self.running: list[tuple[Job, subprocess.Popen, typing.IO[bytes]]] = []

    def start(self, job: Job, spec: ProbeSpec) -> None:
        said = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop); not a pipe, which could fill
        proc = subprocess.Popen(
            spec.argv(),
            stdout=subprocess.PIPE,
            stderr=said,
            text=True,
            start_new_session=True,  # a Ctrl-C reaches tune, which stops them
        )
        self.running.append((job, proc, said))

    def stop(self) -> None:
        for _, proc, said in self.running:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            said.close()
        self.running = []

    def collect(self, curves: Curves, deadline: float, progress) -> None:
        """Read every probe's cells until all have exited; a probe that fails, or outlives
        the deadline, is a MeasureError with what it said."""
        selector = selectors.DefaultSelector()
        for job, proc, _ in self.running:
            selector.register(proc.stdout, selectors.EVENT_READ, job)
        while selector.get_map():
            if time.monotonic() > deadline:
                raise MeasureError("the probes did not finish in their time; stopped them")
            for key, _ in selector.select(timeout=1.0):
                line = key.fileobj.readline()
                if not line:
                    selector.unregister(key.fileobj)
                    continue
                cell = Cell(**json.loads(line))
                curves.add(cell)
                progress.cell(cell)
        for job, proc, said in self.running:
            if proc.wait() != 0:
                said.seek(0)
                lines = said.read().decode("utf-8", "replace").strip().splitlines()
                raise MeasureError(
                    f"cannot measure {job.path} on {job.cores} core(s): the probe exited "
                    f"{proc.returncode}: {' / '.join(lines[-3:]) or 'no message'}"
                )


def measure(
    jobs: list[Job],
    topo: CPUTopology,
    ledger: Ledger | None,
    lengths: tuple[int, ...],
    batches: tuple[int, ...],
    seconds_each: float,
    progress,
) -> Curves:
    """Every job's curves, round by round; the probes' cores held in the ledger meanwhile."""
    curves = Curves()
    for placed in rounds(jobs, topo, ledger):
        probes = Probes()
        if ledger is not None:
            used = CPUSet.union(slot.cpus for _, slot in placed)
            ledger.register("numaserve tune (measuring)", used.whole_cores(topo))
        try:
            for job, slot in placed:
                spec = ProbeSpec(
                    job.model,
                    job.path,
                    slot.binding,
                    lengths,
                    batches,
                    seconds_each,
                    topo.isa,
                )
                probes.start(job, spec)
                progress.started(job, slot)
            probes.collect(curves, time.monotonic() + seconds_each + LOAD_SLACK_S, progress)
        finally:
            probes.stop()
            if ledger is not None:
                ledger.release()
    return curves
