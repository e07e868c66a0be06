"""A fleet of numaserve hosts on one machine: each host a network namespace of its own, joined
to the others by veth pairs into a bridge that lives in a namespace of its own too, so that no
packet of the test touches the machine's own interfaces. A client namespace on the same bridge
runs the load. Needs root (CAP_NET_ADMIN) and iproute2.

Each host runs the real `numaserve start`, under `ip netns exec` and `taskset` (the CPUs a
host would have): host i gets CPU i modulo the CPUs this test may use, so that on a machine
with as many CPUs as hosts each host plans on cores of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import psutil

from tests.harness.console import numaserve_exe
from tests.harness.processes import wait_gone

SUBNET = "10.231.7"
PORT = 5555
CONFIG = """
model: {{path: "bundled:minilm", backend: onnxruntime, quantize: int8}}  # no auto: 3 hosts at once
server: {{endpoint: "tcp://{address}:{port}", insecure: true, heartbeat_ms: 200}}
supervisor: {{drain_timeout_s: 5, kill_timeout_s: 3}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""


def usable() -> str | None:
    """Why the fleet cannot be built here; None where it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("taskset") is None:
        return "needs iproute2 (ip) and util-linux (taskset)"
    return None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Fleet:
    """`hosts` namespaces with a server each (not started), and a client namespace."""

    def __init__(self, directory: Path, hosts: int = 3):
        self.directory = directory
        self.prefix = f"nsf{os.getpid() % 100000}"
        self.bridge = f"{self.prefix}-br"
        self.client_ns = f"{self.prefix}-c"
        self.namespaces = [self.bridge]
        self.hosts: list[Host] = []
        try:
            ip("netns", "add", self.bridge)
            ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge, "link", "set", "br0", "up")
            cpus = sorted(os.sched_getaffinity(0))
            for i in range(hosts):
                cpu = cpus[i % len(cpus)]
                self.hosts.append(Host(self, f"{self.prefix}-h{i}", f"{SUBNET}.{i + 1}", cpu))
            self.join(self.client_ns, f"{SUBNET}.100")
        except BaseException:
            self.close()
            raise

    def join(self, namespace: str, address: str) -> None:
        """A namespace on the bridge at `address` (its interface eth0; the bridge's port pN)."""
        ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        port = f"p{len(self.namespaces)}"
        ip("-n", self.bridge, "link", "add", port, "type", "veth", "peer", "name", "eth0",
           "netns", namespace)  # fmt: skip
        ip("-n", self.bridge, "link", "set", port, "master", "br0", "up")
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")

    @property
    def endpoints(self) -> list[str]:
        return [h.endpoint for h in self.hosts]

    def client(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`numaserve ARGS...` run in the client namespace."""
        return self.run_in(self.client_ns, *args, timeout=timeout)

    def run_in(
        self, namespace: str, *args: str, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        argv = ["ip", "netns", "exec", namespace, numaserve_exe(), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        for host in self.hosts:
            host.kill()
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


class Host:
    """One host: its namespace, address, CPU and server."""

    def __init__(self, fleet: Fleet, namespace: str, address: str, cpu: int):
        self.fleet, self.namespace, self.address, self.cpu = fleet, namespace, address, cpu
        fleet.join(namespace, address)
        self.endpoint = f"tcp://{address}:{PORT}"
        self.config = fleet.directory / f"{namespace}.yaml"
        self.config.write_text(CONFIG.format(address=address, port=PORT))
        self.log_path = fleet.directory / f"{namespace}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """`numaserve start` in the host's namespace, on its CPU, with a core ledger of its own
        (`ip netns exec` and `taskset` exec it: the pid is the supervisor's)."""
        env = {
            **os.environ,
            "NUMASERVE_LEDGER": str(self.fleet.directory / f"{self.namespace}.ledger"),
        }
        argv = ["ip", "netns", "exec", self.namespace, "taskset", "-c", str(self.cpu),
                numaserve_exe(), "start", "--config", str(self.config)]  # fmt: skip
        self.proc = subprocess.Popen(
            argv, stdout=self.log_path.open("a"), stderr=subprocess.STDOUT, env=env
        )

    def status(self) -> dict | None:
        """The server's status, asked from inside its own namespace; None where it does not
        answer."""
        out = self.fleet.run_in(
            self.namespace, "status", "--endpoint", self.endpoint, "--json", "--timeout", "1"
        )
        return json.loads(out.stdout) if out.returncode == 0 else None

    def served(self) -> int:
        """Texts its instances ran since it started."""
        status = self.status() or {}
        return sum(i.get("served", 0) for i in status.get("instances", ()))

    def ready(self) -> bool:
        status = self.status()
        instances = (status or {}).get("instances") or []
        return bool(instances) and all(i["state"] == "ready" and i["routed"] for i in instances)

    def kill(self) -> list[int]:
        """SIGKILL the server's whole process tree at once (a host lost); the pids killed."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        except psutil.NoSuchProcess:
            return []
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        pids = [p.pid for p in tree]
        assert not wait_gone(pids, 10), f"{self.namespace}: processes outlived SIGKILL"
        return pids

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""
