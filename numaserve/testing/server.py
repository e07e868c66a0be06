"""`numaserve start` run as an operator runs it: for end-to-end tests and benchmarks, ours and
yours."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from numaserve.client import Client, ClientKeys, NumaserveError
from numaserve.host.ledger import LEDGER_ENV
from numaserve.status.report import ServerReport
from numaserve.testing.ports import free_port

DEFAULT_METRICS = "127.0.0.1:9464"
DEFAULT_HTTP = "127.0.0.1:8080"
ENDPOINT = (
    "@ENDPOINT@"  # where a config passed to Server names the endpoint; Server picks a free port
)


def with_metrics(config_text: str, address: str, key: str = "metrics") -> str:
    """`config_text` with server.metrics (or `key`: http) on `address`, a free port, so that
    servers started side by side (or beside a real exporter on the default port) never
    collide: the shipped configs' default is replaced, and where the config names none, the
    address goes after `endpoint: "@ENDPOINT@"` (in a flow mapping or a block)."""
    default = {"metrics": DEFAULT_METRICS, "http": DEFAULT_HTTP}[key]
    if default in config_text:
        return config_text.replace(default, address)
    if f"{key}:" in config_text:
        return config_text
    line = next((li for li in config_text.splitlines() if ENDPOINT in li), None)
    if line is None:
        raise ValueError(f"the config names neither {ENDPOINT} nor server.metrics")
    if "{" in line.split(ENDPOINT)[0]:
        entry = f'{ENDPOINT}", {key}: "{address}"'
    else:
        indent = line[: len(line) - len(line.lstrip())]
        entry = f'{ENDPOINT}"\n{indent}{key}: "{address}"'
    return config_text.replace(f'{ENDPOINT}"', entry, 1)


def numaserve_command() -> list[str]:
    """The `numaserve` beside this interpreter (a virtual environment's), or, where the
    script went elsewhere (a system-wide install), this interpreter running the CLI module."""
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "numaserve.cli"]


class Server:
    def __init__(
        self,
        directory: Path,
        config_text: str,
        env=None,
        name: str = "numaserve",
        prefix: tuple[str, ...] = (),
        curve: ClientKeys | None = None,
    ):
        """`prefix`: a command to run `numaserve start` under (strace, say); `curve`: the keys
        its clients use, where the config has server.curve. Each server has a core ledger of
        its own, so that servers a test runs side by side never see each other's CPUs,
        unless `env` names one for them to share (NUMASERVE_LEDGER). `self.env`: the
        environment it runs in; the `numaserve` command run in it finds the server in that
        ledger (`numaserve status` and `stop` ask its supervisor's control socket)."""
        self.curve = curve
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.metrics = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.config = directory / f"{name}.yaml"
        text = with_metrics(with_metrics(config_text, self.metrics), self.http, "http")
        self.config.write_text(text.replace(ENDPOINT, self.endpoint))
        self.log_path = directory / f"{name}.log"
        self.env = {**os.environ, LEDGER_ENV: str(directory / f"{name}.ledger"), **(env or {})}
        self.proc = subprocess.Popen(
            [*prefix, *numaserve_command(), "start", "--config", str(self.config)],
            stdout=self.log_path.open("w"),
            stderr=subprocess.STDOUT,
            env=self.env,
        )

    def log(self) -> str:
        return self.log_path.read_text()

    def status(self) -> dict:
        with Client(self.endpoint, timeout=2, retries=0, curve=self.curve) as c:
            return c.status()

    def instances(self) -> dict:
        return {i["name"]: i for i in self.status()["instances"]}

    def wait_for(self, check, timeout: float = 120, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                result = check()
                if result:
                    return result
            except NumaserveError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited {self.proc.returncode} waiting for {what}:\n{self.log()[-3000:]}"
                )
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-3000:]}")

    def wait_ready(self, timeout: float = 300) -> dict:
        """Every instance ready and routed. A first start on a fresh cache chooses the model
        path (`quantize: auto`, about 90 s for MiniLM on 2 cores) and builds its artifacts."""

        def ready():
            status = self.status()
            inst = {i["name"]: i for i in status["instances"]}
            return (
                inst
                # With the supervisor's slot table: before it, a shard lists only the
                # instances that have reached it, and one ready instance of two looked like all.
                if status.get("supervisor")
                and inst
                and all(i["state"] == "ready" and i["routed"] for i in inst.values())
                else None
            )

        return self.wait_for(ready, timeout, what="every instance ready")

    def wait_replaced(self, name: str, old_pid: int) -> dict:
        """Wait until instance `name` is ready and routed again under a new pid."""
        return self.wait_for(
            lambda: (
                (i := self.instances()[name])["pid"] not in (None, old_pid)
                and i["state"] == "ready"
                and i["routed"]
                and i
            ),
            what=f"{name} replaced",
        )

    def reload(self) -> None:
        """SIGHUP, then wait until every instance routed is a new one and the reload is done."""
        old = {i["pid"] for i in self.instances().values()}
        self.proc.send_signal(signal.SIGHUP)
        self.wait_for(
            lambda: (
                not old & {i["pid"] for i in self.instances().values() if i["routed"]}
                and "reload: done" in self.log()
            ),
            what="reload done",
        )

    def reload_model(self, name: str, old_pid: int) -> None:
        """SIGHUP, then wait until instance `name` runs under a new pid and the reload is done
        (with several models, only the changed ones' instances restart)."""
        self.reload_logged()
        self.wait_replaced(name, old_pid)

    def reload_logged(self, timeout: float = 120) -> None:
        """SIGHUP, then wait until the supervisor logs that the reload is done (this server's
        first)."""
        self.proc.send_signal(signal.SIGHUP)
        self.wait_for(lambda: "reload: done" in self.log(), timeout=timeout, what="reload done")

    def router_pid(self) -> int:
        """The router's pid: the supervisor's child running numaserve.router."""
        out = subprocess.check_output(["pgrep", "-f", "-P", str(self.proc.pid), "numaserve.router"])
        return int(out.split()[0])

    def shard_pid(self, shard: int) -> int:
        """The supervisor's child running router shard `shard` (its spec is on its command line)."""
        for child in psutil.Process(self.proc.pid).children():
            argv = child.cmdline()
            if "numaserve.router" in argv and json.loads(argv[-1])["shard"] == shard:
                return child.pid
        raise AssertionError(f"no router shard {shard} under {self.proc.pid}")

    @property
    def url(self) -> str:
        """The HTTP API's base URL (server.http)."""
        return f"http://{self.http}"

    def http_pids(self) -> list[int]:
        """The fronts' pids: the supervisor's children running numaserve.fronts."""
        pids = []
        for child in psutil.Process(self.proc.pid).children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "numaserve.fronts" in child.cmdline():
                    pids.append(child.pid)
            except psutil.Error:
                continue  # exited meanwhile
        return pids

    def pids(self) -> list[int]:
        report = ServerReport.from_wire(self.status())
        return [report.supervisor.pid, *(i.slot.pid for i in report.instances if i.slot.pid)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
