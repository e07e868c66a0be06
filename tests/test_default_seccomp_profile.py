"""A whole server as a Kubernetes pod runs it under `seccompProfile: RuntimeDefault` with every
capability dropped: the memory-policy calls (set_mempolicy, mbind, get_mempolicy) refused
with EPERM (tests/harness/seccomp.py). This host's cpuset.mems is its one node, each slot's:
the cgroup binds the memory, and the server serves and says so. The refusal where cpuset.mems
is wider than a slot's node runs in the 2-node VM (tests/test_numa_vm.py)."""

import time
import urllib.request

from numaserve.client import Client
from tests.harness.seccomp import UNDER_DEFAULT_PROFILE
from tests.harness.server import Server

CONFIG = """
model: {path: bundled:minilm, backend: onnxruntime, quantize: int8}
server: {endpoint: "@ENDPOINT@", cache_entries: 0}
placement:
  pools: [{name: main, max_tokens: 256, instances: 2, cores_per_instance: 1}]
"""


def bound_series(server, within: float = 15.0) -> int:
    """The cpuset-bound instances /metrics shows, once it shows both: it is drawn from the
    shards' status, a few heartbeats behind an instance's ready (longer on a busy host)."""
    deadline = time.monotonic() + within
    while True:
        with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=5) as reply:
            found = (
                reply.read()
                .decode()
                .count('numaserve_instance_memory_binding_info{bound_by="cpuset"')
            )
        if found == 2 or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def test_a_server_under_the_default_profile_serves_with_memory_bound_by_its_cpuset(tmp_path):
    server = Server(tmp_path, CONFIG, prefix=UNDER_DEFAULT_PROFILE)
    try:
        server.wait_ready(timeout=180)
        with Client(server.endpoint, timeout=30) as client:
            assert len(client.embed(["served where set_mempolicy is refused"])[0].vector) == 384
        instances = server.instances()
        assert {i["membind"] for i in instances.values()} == {"cpuset"}, instances
        assert bound_series(server) == 2
        assert "memory bound by cgroup cpuset.mems" in server.log()
    finally:
        server.stop()
