"""Three numaserve hosts and one client that knows all three (tests/harness/fleet.py: each host
a network namespace, joined by a bridge in a namespace of its own). The client spreads its
load over them; a host whose whole process tree is SIGKILLed under load costs no request
beyond the client's retries; started again, it takes traffic again within 15 s. Slow (real
servers and the model): CI runs it in its slow step, as root."""

import json
import subprocess
import time

import pytest

from tests.harness import fleet as fleet_
from tests.harness.console import numaserve_exe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(fleet_.usable()), reason=fleet_.usable() or ""),
]

RATE, RETRIES, TRY_S = "40", "3", "1"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    made = fleet_.Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        for host in made.hosts:  # one at a time: the first builds the model's artifact
            host.start()
            wait_until(host.ready, 300, f"{host.namespace} ready", host)
        yield made
    finally:
        made.close()


def wait_until(check, timeout: float, what: str, host=None) -> float:
    """Seconds until `check()` holds."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out: {what}\n{host.log()[-3000:] if host else ''}")
        time.sleep(0.25)
    return time.monotonic() - began


def bench_args(fleet, duration: float) -> list[str]:
    endpoints = [arg for e in fleet.endpoints for arg in ("--endpoint", e)]
    return ["bench", *endpoints, "--rate", RATE, "--duration", str(duration),
            "--retries", RETRIES, "--timeout", TRY_S, "--json"]  # fmt: skip


def test_the_load_spreads_within_20_percent_over_the_hosts(fleet):
    out = fleet.client(*bench_args(fleet, 10))
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    servers = summary["servers"]
    print(f"\nspread over {len(servers)} hosts, {summary['ok']} replies: {servers}")
    assert summary["errors"] == {}
    assert set(servers) == set(fleet.endpoints)
    mean = sum(servers.values()) / len(servers)
    assert all(abs(n - mean) <= 0.2 * mean for n in servers.values()), servers


def test_a_host_killed_under_load_fails_no_request_and_takes_traffic_again_once_back(fleet):
    lost = fleet.hosts[1]
    load = subprocess.Popen(
        ["ip", "netns", "exec", fleet.client_ns, numaserve_exe(), *bench_args(fleet, 30)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(8)
        killed = lost.kill()
        time.sleep(4)
        lost.start()
        back_s = wait_until(lambda: lost.served() > 0, 15, "the host back takes traffic", lost)
        stdout, stderr = load.communicate(timeout=120)
    finally:
        if load.poll() is None:
            load.kill()
    summary = json.loads(stdout)
    print(
        f"\nkilled {len(killed)} processes of {lost.namespace}; {summary['ok']} of "
        f"{summary['requests']} requests answered, errors {summary['errors']}, p99 "
        f"{summary['latency_ms']['p99']} ms, max {summary['latency_ms']['max']} ms; back to "
        f"taking traffic {back_s:.1f} s after its start; replies {summary['servers']}"
    )
    assert load.returncode == 0, stderr
    assert summary["errors"] == {}, summary["error_messages"]
    assert summary["ok"] == summary["requests"] == int(RATE) * 30
