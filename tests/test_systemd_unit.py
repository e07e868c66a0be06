"""The shipped unit under a real systemd: the container that `python -m
tests.systemd_container` boots has the host's systemd as PID 1, on the host's CPUs and nodes.

systemd/numaserve.service is installed as it is, hardening and all, with one drop-in for what
differs in the test bed: where this checkout's virtual environment lives. The unit's cache
holds the artifacts prepared for this CPU before the boot, as a prepared host's does. The
tests run in file order against one service: start, a second unit refused its cores, status,
reload, watchdog, stop. Skipped where systemd is not PID 1.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numaserve.client import Client
from numaserve.host.ledger import LEDGER_ENV, Ledger
from numaserve.host.pinning import read_numa_maps
from numaserve.host.topology import read_topology
from numaserve.testing.load import RawLoad
from numaserve.wire.control import ControlConnection
from tests.harness.console import numaserve_exe
from tests.harness.http import http_get
from tests.harness.processes import still_running
from tests.harness.waiting import eventually

pytestmark = [
    pytest.mark.systemd_unit,
    pytest.mark.skipif(
        Path("/proc/1/comm").read_text().strip() != "systemd",
        reason="needs systemd as PID 1: run python -m tests.systemd_container",
    ),
]
REPO = Path(__file__).resolve().parents[1]
UNIT = "numaserve.service"
SECOND = "numaserve-second.service"  # a second server on the same host
ENDPOINT = "tcp://127.0.0.1:5555"
READYZ = "http://127.0.0.1:9464/readyz"  # server.metrics' default
DROP_IN = """[Service]
ExecStart=
ExecStart={venv}/numaserve start --config /etc/numaserve/numaserve.yaml
# The checkout, the Python it runs on (pyenv's lives in /root) and the model may be under
# /root or /home, which ProtectHome hides: show those alone, read-only.
ProtectHome=tmpfs
BindReadOnlyPaths={paths}
"""


def systemctl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=timeout)


def show(*props: str, unit: str = UNIT) -> dict[str, str]:
    out = systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def status() -> dict:
    with Client(ENDPOINT, timeout=30, retries=0) as c:
        return c.status()


def journal(after: str | None = None, unit: str = UNIT) -> str:
    """The unit's journal, or only what came after the cursor `after` (see `cursor`)."""
    since = [f"--after-cursor={after}"] if after else []
    return subprocess.run(
        ["journalctl", "--no-pager", "-o", "cat", "-u", unit, *since],
        capture_output=True,
        text=True,
    ).stdout


def cursor() -> str:
    out = subprocess.run(
        ["journalctl", "--no-pager", "-n", "0", "--show-cursor", "-u", UNIT],
        capture_output=True,
        text=True,
    ).stdout
    return out.rsplit("-- cursor: ", 1)[1].strip()


def all_ready(st: dict) -> bool:
    instances = st["instances"]
    return bool(instances) and all(i["state"] == "ready" and i["routed"] for i in instances)


def with_the_artifacts_prepared_before_the_boot() -> None:
    """The unit's cache (CacheDirectory) holding the artifacts prepared for this CPU
    (tests/systemd_container.py), owned by the numaserve user, as an image built elsewhere, or
    docs/deployment.md's `numaserve prepare` step, leaves it: the first start checks their
    digests and builds nothing."""
    cache = Path("/var/cache/numaserve")
    shutil.copytree(os.environ["NUMASERVE_UNIT_ARTIFACTS"], cache)
    subprocess.run(["chown", "-R", "numaserve:numaserve", str(cache)], check=True)


@pytest.fixture(scope="module", autouse=True)
def installed():
    """The unit, a drop-in, a config and the numaserve user, as docs/deployment.md says."""
    config, model = (os.environ.get(f"NUMASERVE_UNIT_{what}") for what in ("CONFIG", "MODEL"))
    if not (config and model):
        pytest.fail("NUMASERVE_UNIT_CONFIG is not set: run python -m tests.systemd_container")
    subprocess.run(["useradd", "--system", "--no-create-home", "numaserve"], check=True)
    Path("/etc/numaserve").mkdir()
    shutil.copyfile(config, "/etc/numaserve/numaserve.yaml")
    units = Path("/run/systemd/system")
    (units / f"{UNIT}.d").mkdir(parents=True)
    (units / UNIT).write_text((REPO / "systemd" / UNIT).read_text())
    venv = Path(sys.executable).parent
    paths = " ".join(str(p) for p in (REPO, sys.base_prefix, model))
    (units / f"{UNIT}.d" / "test-bed.conf").write_text(DROP_IN.format(venv=venv, paths=paths))
    with_the_artifacts_prepared_before_the_boot()
    assert systemctl("daemon-reload").returncode == 0
    yield
    systemctl("stop", UNIT)
    print(systemctl("status", "--no-pager", "--lines=0", UNIT).stdout)
    print(journal()[-6000:])


def test_start_returns_only_once_every_instance_is_ready():
    start = subprocess.Popen(["systemctl", "start", UNIT], stderr=subprocess.PIPE, text=True)
    seen = set()
    while start.poll() is None:
        seen.add(show("ActiveState")["ActiveState"])
        time.sleep(1)
    assert start.returncode == 0, start.stderr.read()
    # Straight after `systemctl start` returns, with no waiting: READY=1 came last.
    assert all_ready(status())
    assert http_get(READYZ)[0] == 200
    assert show("ActiveState")["ActiveState"] == "active"
    assert "activating" in seen  # systemd held the start while the instances loaded


def test_the_first_start_loads_the_prepared_artifact_and_builds_nothing():
    said = journal()
    assert "building the ONNX artifact" not in said, said
    assert "artifact /var/cache/numaserve/onnx/" in said, said


def test_the_hardened_unit_still_pins_each_instance_and_binds_its_memory():
    """Behind ProtectSystem, ProtectKernelTunables and no capabilities, the server still reads
    every node of the host (the topology read here, outside the unit), puts an instance on
    each, pins it and binds its memory there."""
    instances = status()["instances"]
    host_nodes = [node.id for node in read_topology().nodes]
    assert sorted({tuple(i["nodes"]) for i in instances}) == [(n,) for n in host_nodes]
    for i in instances:
        assert i["affinity_ok"], i
        (node,) = i["nodes"]
        assert f"bind:{node}" in read_numa_maps(i["pid"]).policies, i


def test_a_second_unit_of_the_same_config_is_refused_naming_the_first():
    """Two units, one core ledger (/run/numaserve, the unit's RuntimeDirectory): a copy of
    the unit with the same config finds it served already, and exits 75 at once, naming the
    first unit's supervisor and endpoint, while the first serves on."""
    main_pid = show("MainPID")["MainPID"]
    entry = json.loads(Path(f"/run/numaserve/server-{main_pid}.json").read_text())
    assert entry["config"] == "/etc/numaserve/numaserve.yaml"
    assert {cpu for i in status()["instances"] for cpu in i["cpus"]} <= set(entry["cpus"])
    units = Path("/run/systemd/system")
    (units / SECOND).write_text((REPO / "systemd" / UNIT).read_text())
    (units / f"{SECOND}.d").mkdir()
    test_bed = (units / f"{UNIT}.d" / "test-bed.conf").read_text()
    (units / f"{SECOND}.d" / "test-bed.conf").write_text(test_bed + "Restart=no\n")
    assert systemctl("daemon-reload").returncode == 0

    assert systemctl("start", SECOND, timeout=300).returncode != 0

    assert show("ExecMainStatus", unit=SECOND)["ExecMainStatus"] == "75"
    said = journal(unit=SECOND)
    assert f"served already, by pid {main_pid} on tcp://" in said, said
    assert all_ready(status())
    systemctl("reset-failed", SECOND)


def test_systemctl_status_shows_the_supervisors_status_line():
    line = show("StatusText")["StatusText"]
    # "2 ready; routers ready" with a router shard on each of two nodes, "router" with one
    assert line.startswith(f"{len(status()['instances'])} ready; router"), line
    assert f'Status: "{line}"' in systemctl("status", "--no-pager", UNIT).stdout


def test_numaserve_status_as_root_asks_the_units_supervisor_on_its_control_socket():
    """As an operator runs it: root, with the system's ledger (/run/numaserve, not the test
    run's), the supervisor running as its own user behind PrivateTmp and ProtectSystem."""
    main_pid = int(show("MainPID")["MainPID"])
    holder = Ledger(Path("/run/numaserve")).serving_at(ENDPOINT)
    assert holder is not None and holder.pid == main_pid
    socket_file = os.stat(holder.control)
    assert oct(socket_file.st_mode & 0o777) == "0o600"
    assert pwd.getpwuid(socket_file.st_uid).pw_name == "numaserve"
    with ControlConnection(holder.control, timeout=120) as control:
        assert control.ask("status")["status"]["supervisor"]["pid"] == main_pid
    env = {k: v for k, v in os.environ.items() if k != LEDGER_ENV}
    out = subprocess.run(
        [numaserve_exe(), "status", "--json", "--endpoint", ENDPOINT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["supervisor"]["pid"] == main_pid


def test_reload_under_client_load_fails_no_request():
    main_pid = show("MainPID")["MainPID"]
    before = {i["pid"] for i in status()["instances"]}
    load = RawLoad(ENDPOINT, clients=2, depth=2, rate=10, op="classify")
    time.sleep(2)
    assert systemctl("reload", UNIT).returncode == 0

    def reloaded():
        st = status()
        pids = {i["pid"] for i in st["instances"]}
        return (
            all_ready(st)
            and not pids & before
            and "reloading" not in show("StatusText")["StatusText"]
        )

    eventually(reloaded, timeout=1200, every=2)
    time.sleep(2)
    outcomes = load.stop(drain_s=60)
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) == {"ok"} and outcomes.sent > 20, outcomes.summary()
    assert show("MainPID")["MainPID"] == main_pid  # the supervisor itself stayed


def test_a_hung_supervisor_is_killed_by_the_watchdog_and_restarted():
    before = show("MainPID", "NRestarts")
    workers = [i["pid"] for i in status()["instances"]]
    os.kill(int(before["MainPID"]), signal.SIGSTOP)

    def restarted_and_ready():
        now = show("MainPID", "ActiveState")
        return now["MainPID"] not in ("0", before["MainPID"]) and now["ActiveState"] == "active"

    eventually(restarted_and_ready, timeout=1200, every=2)
    assert int(show("NRestarts")["NRestarts"]) == int(before["NRestarts"]) + 1
    assert "Watchdog timeout" in journal()
    assert not any(still_running(p) for p in workers)  # the hung supervisor's workers went with it
    assert all_ready(status())


def test_stop_drains_and_exits_0():
    st = status()
    pids = [st["supervisor"]["pid"], *(i["pid"] for i in st["instances"])]
    load = RawLoad(ENDPOINT, clients=4, depth=4, op="classify")  # 16 always in flight
    time.sleep(2)
    # Requests that reach a router after it has drained and gone get no answer: that is what
    # the client's timeout is for. What must be answered is what is in flight at the stop.
    load.stop_sending(drain_s=60)
    before_stop = cursor()
    assert systemctl("stop", "--no-block", UNIT).returncode == 0
    outcomes = load.stop(drain_s=60)
    eventually(lambda: show("ActiveState")["ActiveState"] == "inactive", timeout=120)
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) <= {"ok", "no_instance"}, outcomes.summary()
    # Not `systemctl show`'s ExecMainStatus: systemd unloads an inactive unit that nothing
    # refers to, and a reloaded one shows 0 whatever happened. Its journal keeps the end.
    stopping = journal(after=before_stop)
    assert "draining:" in stopping  # each shard says how many requests it was finishing
    assert "Deactivated successfully" in stopping, stopping  # exit 0
    assert "Main process exited" not in stopping and "Failed with result" not in stopping, stopping
    assert not any(still_running(p) for p in pids)
