"""A real numaserve (router + pinned workers) started from a config, for end-to-end tests and
benchmarks.

The router and the workers are started directly, without the supervisor, from the same
Deployment `numaserve start` uses: the router's tests then see the router alone (no restarts
behind their back). Real processes, real sockets, real pinning. testing/server.py runs the
whole `numaserve start` instead.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from numaserve.client import Client, ClientKeys
from numaserve.config.schema import parse_config, with_checkpoint_lengths
from numaserve.host.placement import plan_placement
from numaserve.host.topology import read_topology
from numaserve.processes.specs import deployment
from numaserve.status.report import ServerReport
from numaserve.testing.ports import free_port


class Cluster:
    def __init__(self, directory: Path, yaml_text: str, curve: ClientKeys | None = None):
        """`curve`: the keys its clients use, where the config has server.curve."""
        self.directory = directory
        self.curve = curve
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.config_file = directory / "cluster.yaml"
        self.config_file.write_text(yaml_text)
        config = with_checkpoint_lengths(parse_config(yaml_text))
        # A router and its workers alone: no HTTP fronts (server.http is numaserve start's).
        config = replace(config, server=replace(config.server, endpoint=self.endpoint, http=""))
        topo = read_topology()
        self.deployment = deployment(
            config, plan_placement(topo, config.placement), topo, directory
        )
        self.router = None
        self.workers = {}

    def prepare(self) -> None:
        """What the supervisor does first: `numaserve prepare`, its records in `directory`,
        where the deployment's worker specs name them."""
        if not any(spec.prepared for spec in self.deployment.workers):
            return
        argv = [sys.executable, "-m", "numaserve.cli", "prepare", "--config", str(self.config_file)]
        with (self.directory / "prepare.log").open("a") as log:
            done = subprocess.run([*argv, "--record-dir", str(self.directory)], stderr=log)
        if done.returncode:
            raise RuntimeError(f"numaserve prepare exited {done.returncode}; see {log.name}")

    def start(self, wait: bool = True) -> Cluster:
        self.prepare()
        (router,) = self.deployment.routers  # one shard: this harness has no frontend
        self.router = self._spawn("router", router.argv())
        for spec in self.deployment.workers:
            self.start_worker(spec.slot.name)
        if wait:
            self.wait_ready(len(self.deployment.workers))
        return self

    def start_worker(self, name: str) -> subprocess.Popen:
        spec = next(s for s in self.deployment.workers if s.slot.name == name)
        self.workers[name] = self._spawn(name, spec.argv())
        return self.workers[name]

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = (self.directory / f"{name}.log").open("a")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def client(self, **kw) -> Client:
        return Client(self.endpoint, **{"curve": self.curve, **kw})

    def wait_ready(self, instances: int, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        with self.client(timeout=1, retries=0) as c:
            while time.monotonic() < deadline:
                try:
                    status = c.status()
                    report = ServerReport.from_wire(status)
                    if sum(i.slot.state == "ready" for i in report.instances) >= instances:
                        return status
                except Exception:
                    pass
                time.sleep(0.2)
        raise TimeoutError(
            f"{instances} instance(s) not ready in {timeout} s; logs in {self.directory}"
        )

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text()

    def stop(self) -> None:
        procs = [p for p in [self.router, *self.workers.values()] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
