"""A child whose supervisor died before the child asked to die with it exits at once."""

import os
import subprocess
import sys

from numaserve.config.schema import PoolConfig, ServerConfig
from numaserve.processes.lifecycle import PARENT_ENV
from numaserve.processes.specs import RouterSpec
from numaserve.testing.ports import free_port


def test_a_router_whose_supervisor_is_already_gone_exits_instead_of_serving(tmp_path):
    spec = RouterSpec(
        workers_endpoint=f"ipc://{tmp_path}/workers.sock",
        pools=(PoolConfig(name="main", max_tokens=256),),
        server=ServerConfig(endpoint=f"tcp://127.0.0.1:{free_port()}"),
    )
    # Our pid is its parent's: the supervisor it names (pid 1 here) is not, as after a
    # supervisor that died between spawning it and its prctl(PR_SET_PDEATHSIG).
    router = subprocess.run(
        [sys.executable, "-m", "numaserve.router", "--spec", spec.to_json()],
        env={**os.environ, PARENT_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert router.returncode == 1
    assert "listening on" not in router.stderr
