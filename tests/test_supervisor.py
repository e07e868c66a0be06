"""`numaserve start` as an operator runs it: real processes, signals, and a client sending
continuously throughout. Slow (each test starts a server): CI runs them in their own step."""

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import Client, NoInstance, NumaserveError
from numaserve.config.schema import load_config
from numaserve.host.placement import plan_placement
from numaserve.host.topology import read_topology
from numaserve.processes import exitcodes
from tests.harness import server as server_
from tests.harness.console import numaserve
from tests.harness.processes import still_running

pytestmark = pytest.mark.slow

BASE = """
model: {{path: {model}{model_keys}}}
server: {{endpoint: "{endpoint}", heartbeat_ms: 200, heartbeat_liveness: 3}}
supervisor: {{drain_timeout_s: 15, kill_timeout_s: 3, backoff_initial_s: 0.2, backoff_max_s: 2{supervisor}}}
logging: {{format: {format}}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: auto}}]
"""


def start_server(
    directory: Path,
    model: str = "bundled:minilm",
    fmt: str = "text",
    env=None,
    supervisor="",
    model_keys="",
) -> server_.Server:
    """`supervisor`, `model_keys`: more keys of those sections, e.g. "stable_s: 30"."""
    text = BASE.format(
        model=model,
        model_keys=f", {model_keys}" if model_keys else "",
        endpoint=server_.ENDPOINT,
        format=fmt,
        supervisor=f", {supervisor}" if supervisor else "",
    )
    return server_.Server(directory, text, env)


@pytest.fixture
def server(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()


class Load:
    """Clients sending unique texts back to back, recording how each request ended."""

    # What a draining server's clients may see: answers; a clear `no_instance` for requests
    # sent during the drain; and, for those sent after the exit, that nothing listens any more
    # (or, connecting as its socket closed, that the connection closed before the handshake;
    # a few Timeouts where the exit came while one waited).
    DRAIN_OUTCOMES = frozenset({"ok", "NoInstance", "Timeout", "Unreachable", "HandshakeFailed"})

    def __init__(self, endpoint: str, clients: int = 2):
        self.endpoint = endpoint
        self.outcomes: list[str] = []
        self.running = True
        self.threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _run(self, n: int) -> None:
        with Client(self.endpoint, timeout=10, retries=3) as client:
            i = 0
            while self.running:
                i += 1
                try:
                    client.embed(
                        f"client {n} request {i}: the quick brown fox jumps over the lazy dog"
                    )
                    self.outcomes.append("ok")
                except NumaserveError as e:
                    self.outcomes.append(type(e).__name__)
                    if isinstance(e, NoInstance):
                        time.sleep(0.05)

    def stop(self) -> dict:
        self.running = False
        for t in self.threads:
            t.join(60)
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o] = counts.get(o, 0) + 1
        return counts


def test_a_killed_worker_comes_back_on_its_cpus_and_no_request_fails(server):
    before = server.wait_ready()
    load = Load(server.endpoint)
    time.sleep(1)
    victim = before["main-0"]
    os.kill(victim["pid"], signal.SIGKILL)

    def back():
        inst = server.instances()["main-0"]
        return (
            inst
            if inst["pid"] != victim["pid"] and inst["state"] == "ready" and inst["routed"]
            else None
        )

    after = server.wait_for(back, what="main-0 restarted")
    time.sleep(1)
    counts = load.stop()
    assert (after["cpus"], after["nodes"], after["live_cpus"]) == (
        victim["cpus"],
        victim["nodes"],
        victim["cpus"],
    )
    assert after["affinity_ok"] and after["restarts"] == 1
    assert counts.get("ok", 0) > 50 and set(counts) == {"ok"}, counts
    log = server.log()
    assert (
        "exit main-0: killed by SIGKILL (not by numaserve: possibly the out-of-memory killer" in log
    )
    assert "restart main-0 (restart 1)" in log


def test_a_worker_killed_by_a_real_time_signal_is_restarted_and_the_server_keeps_serving(server):
    before = server.wait_ready()
    victim = before["main-0"]
    os.kill(victim["pid"], signal.SIGRTMIN + 2)  # no name in signal.Signals
    after = server.wait_replaced("main-0", victim["pid"])
    assert after["cpus"] == victim["cpus"] and after["affinity_ok"]
    assert server.proc.poll() is None
    assert "exit main-0: killed by SIGRTMIN+2" in server.log()


def test_a_worker_that_dies_right_after_ready_backs_off_then_goes_fatal(tmp_path):
    server = start_server(tmp_path, supervisor="stable_s: 30")
    try:
        pid = server.wait_ready()["main-0"]["pid"]
        for _ in range(2):  # a crash right after READY, as a model that fails on first use
            os.kill(pid, signal.SIGKILL)
            pid = server.wait_replaced("main-0", pid)["pid"]
        os.kill(pid, signal.SIGKILL)
        server.wait_for(
            lambda: server.instances()["main-0"]["state"] == "fatal", what="main-0 fatal"
        )
        log = server.log()
        assert "backoff main-0: restarting in 0.2 s" in log
        assert "backoff main-0: restarting in 0.4 s" in log  # exponential
        assert "main-0 exited 3 times in a row before it had been ready for 30 s" in log
        with Client(server.endpoint, timeout=10) as client:  # main-1 still serves
            assert client.embed("still serving").tokens > 0
    finally:
        server.stop()


def test_a_first_build_runs_before_the_instances_outside_their_start_timeout(tmp_path):
    # A cold cache: the export takes about 10 s here, twice the instances' start timeout. A
    # named path, not `auto`, whose race of every candidate would add two minutes to no end.
    server = start_server(
        tmp_path,
        supervisor="start_timeout_s: 5",
        model_keys="backend: onnxruntime, quantize: int8",
        env={"NUMASERVE_CACHE": str(tmp_path / "cold-cache")},
    )
    try:
        server.wait_ready(timeout=300)
        log = server.log()
        assert log.index("numaserve.backends INFO prepared in") < log.index("spawn main-0")
        assert "not ready after" not in log and "restart main" not in log
    finally:
        server.stop()


def test_the_router_is_ready_only_once_the_new_one_listens(server):
    server.wait_ready()
    os.kill(server.router_pid(), signal.SIGKILL)
    server.wait_for(lambda: server.log().count("ready router") >= 2, what="router ready again")
    after_kill = server.log().split("exit router: killed by SIGKILL", 1)[1]
    assert after_kill.index("listening on") < after_kill.index("ready router")


def test_a_worker_whose_model_no_longer_loads_goes_fatal_without_crash_looping(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(resolve_model_path("bundled:minilm"), model)
    server = start_server(tmp_path, model=str(model))
    try:
        before = server.wait_ready()
        load = Load(server.endpoint, clients=1)
        # An instance loads the artifact prepare resolved for it (its spec names the record):
        # that file damaged by a bad deploy. (Prepare finds it damaged and rebuilds it.)
        spec = json.loads(psutil.Process(before["main-1"]["pid"]).cmdline()[-1])
        record = json.loads(Path(spec["prepared"]).read_text())
        artifact = Path(record["pools"]["main"]["artifact"])
        for f in [artifact] if artifact.is_file() else artifact.glob("model.bin"):
            f.write_bytes(b"corrupted by a bad deploy")
        os.kill(before["main-1"]["pid"], signal.SIGKILL)
        server.wait_for(
            lambda: server.instances()["main-1"]["state"] == "fatal", what="main-1 fatal"
        )
        time.sleep(2)  # would it loop? give it the time to
        counts = load.stop()
        log = server.log()
        assert log.count("spawn main-1") == 2  # the first start, and one restart: no loop
        assert "fatal: main-1 could not load its model; not restarting it" in log
        assert f"cannot load {artifact}" in log or "cannot load the ONNX artifact" in log
        assert server.instances()["main-0"]["state"] == "ready"
        assert counts.get("ok", 0) > 10 and set(counts) == {"ok"}, counts
    finally:
        server.stop()


def test_sigterm_answers_requests_in_flight_and_exits_0(tmp_path):
    server = start_server(tmp_path, fmt="json")
    try:
        server.wait_ready()
        pids = server.pids()
        load = Load(server.endpoint, clients=3)
        time.sleep(1)
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(30)
        took = time.monotonic() - started
        counts = load.stop()
    finally:
        server.stop()
    assert code == 0 and took < 15
    assert set(counts) <= Load.DRAIN_OUTCOMES and counts.get("Timeout", 0) <= 3, counts
    assert not any(still_running(p) for p in pids)
    events = [json.loads(line) for line in server.log().splitlines()]  # every line is JSON
    seen = {e.get("event") for e in events}
    assert {"spawn", "ready", "serving", "drain", "exit", "stopped"} <= seen


def test_sighup_reloads_one_instance_at_a_time_without_failing_a_request(server):
    before = server.wait_ready()
    load = Load(server.endpoint)
    time.sleep(1)
    server.reload_logged()
    after = server.wait_ready()
    time.sleep(1)
    counts = load.stop()
    assert all(after[n]["pid"] != before[n]["pid"] for n in before)
    assert all(after[n]["cpus"] == before[n]["cpus"] for n in before)
    assert counts.get("ok", 0) > 50 and set(counts) == {"ok"}, counts


def test_a_reload_that_changes_the_model_builds_it_before_restarting_any_instance(tmp_path):
    server = start_server(tmp_path, supervisor="start_timeout_s: 5")
    try:
        before = server.wait_ready(timeout=300)
        load = Load(server.endpoint)
        # fp32 has no artifact yet: its build (about 8 s here) outlasts the start timeout.
        server.config.write_text(
            server.config.read_text().replace("model: {path:", "model: {quantize: none, path:")
        )
        server.reload_logged(timeout=300)
        after = server.wait_ready()
        counts = load.stop()
        log = server.log().split("reload: restarting", 1)[1]
        assert log.index("the changed model's artifact is ready") < log.index("spawn main-0 pid")
        assert "not ready after" not in log and "reload aborted" not in log
        assert all(after[n]["pid"] != before[n]["pid"] for n in before)
        assert counts.get("ok", 0) > 50 and set(counts) == {"ok"}, counts
    finally:
        server.stop()


def test_a_worker_that_stops_heartbeating_is_killed_and_restarted(server):
    before = server.wait_ready()
    victim = before["main-1"]["pid"]
    os.kill(victim, signal.SIGSTOP)  # alive, but silent
    back = server.wait_replaced("main-1", victim)
    assert back["cpus"] == before["main-1"]["cpus"]
    log = server.log()
    assert "main-1 stopped heartbeating: SIGTERM, then SIGKILL" in log
    assert "main-1 did not stop in time: SIGKILL" in log


def test_killing_the_supervisor_leaves_no_process_behind(server):
    server.wait_ready()
    supervisor, *children = server.pids()
    router_pid = server.router_pid()
    assert len(children) == len(server.instances()) and router_pid not in children
    assert all(still_running(p) for p in [*children, router_pid])  # each is running before
    os.kill(supervisor, signal.SIGKILL)
    server.proc.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(still_running(p) for p in [*children, router_pid]):
        time.sleep(0.2)
    assert not any(still_running(p) for p in [*children, router_pid])


def test_a_model_that_is_not_there_stops_the_start_with_the_model_code(tmp_path):
    server = start_server(tmp_path, model=str(tmp_path / "no-such-model"))
    code = server.proc.wait(120)
    log = server.log()
    assert code == exitcodes.MODEL, log
    assert "no such directory" in log  # found before anything starts
    assert "spawn" not in log


def test_systemd_hears_ready_only_once_every_instance_is_ready(tmp_path):
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    listener.bind(path)
    listener.settimeout(120)
    server = start_server(tmp_path, env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    try:
        messages = []
        while not any(m.startswith("READY=1") for m in messages):
            messages.append(listener.recv(4096).decode())
        instances = server.instances()  # asked right after READY=1 arrived
        assert all(i["state"] == "ready" for i in instances.values()), instances
        assert any(m.startswith("STATUS=") and "starting" in m for m in messages[:-1])
        assert f"MAINPID={server.proc.pid}" in messages[-1]
        later = [listener.recv(4096).decode() for _ in range(3)]
        assert "WATCHDOG=1" in later
        server.proc.send_signal(signal.SIGTERM)
        while not listener.recv(4096).decode().startswith("STOPPING=1"):
            pass
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
        listener.close()


def test_status_and_stop_commands_ask_the_supervisor_on_its_control_socket(server):
    server.wait_ready()
    with Client(server.endpoint, timeout=30) as client:
        client.embed([f"text {i}" for i in range(3)])
        client.embed(["one more"])
    # Run as the server's user, with its environment: the CLI finds it in its ledger.
    status = numaserve("status", "--endpoint", server.endpoint, env=server.env)
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if line.startswith("main-")]
    planned = plan_placement(read_topology(), load_config(server.config).placement).slots
    assert len(rows) == len(planned) and all("(as planned)" in r and " ready " in r for r in rows)
    assert "cache:" in status.stdout and f"supervisor: pid {server.proc.pid}" in status.stdout
    assert "(auto: texts of " in status.stdout  # auto's why, by the lengths each path runs
    assert "  accuracy: " in status.stdout and "(bar 99%)" in status.stdout  # and its figures
    counts = numaserve("status", "--json", "--endpoint", server.endpoint, env=server.env)
    assert json.loads(counts.stdout)["requests"]["replies_ok"] == 2  # fresh, not a second old
    stop = numaserve("stop", "--endpoint", server.endpoint, env=server.env)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stderr
    assert server.proc.wait(10) == 0
    assert "numaserve stop (pid" in server.log()


def test_a_second_sigint_stops_fast(server):
    server.wait_ready()
    pids = server.pids()
    server.proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(15) == 128 + signal.SIGINT
    assert "fast stop: killing every process now" in server.log()
    assert not any(still_running(p) for p in pids)
