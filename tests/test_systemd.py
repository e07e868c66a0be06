"""The shipped systemd unit: systemd-analyze accepts it without a warning, and it says what
docs/deployment.md promises."""

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numaserve.config.schema import SupervisorConfig
from numaserve.processes import exitcodes

UNIT = Path(__file__).parents[1] / "systemd" / "numaserve.service"


def settings() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNIT)
    return parser


@pytest.mark.skipif(
    not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed (CI installs it)"
)
def test_systemd_analyze_verify_accepts_the_unit_without_warnings(tmp_path):
    venv_bin = Path(sys.executable).parent
    unit = tmp_path / "numaserve.service"  # the same unit, with ExecStart at this checkout's venv
    unit.write_text(UNIT.read_text().replace("/opt/numaserve/venv/bin", str(venv_bin)))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


def test_unit_is_a_notify_service_that_reloads_and_stops_gracefully():
    service = settings()["Service"]
    assert service["Type"] == "notify"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    # systemd must not restart what the supervisor itself would never restart
    assert set(service["RestartPreventExitStatus"].split()) == {
        str(code) for code in exitcodes.NEVER_RESTART
    }
    defaults = SupervisorConfig()
    assert int(service["TimeoutStopSec"]) > defaults.drain_timeout_s + defaults.kill_timeout_s


def test_unit_runs_hardened_as_its_own_user():
    service = settings()["Service"]
    assert service["User"] == "numaserve"
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["PrivateTmp"] == "yes"
