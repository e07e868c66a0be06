"""No numaserve process opens a connection off the host: a serving server, traced through
every child with strace, connects only to loopback addresses and local sockets."""

import contextlib
import os
import re
import shutil
import signal
import time

import pytest

from numaserve.client import Client
from tests.harness import server as server_

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("strace"), reason="needs strace (apt-get install strace)"),
]

CONFIG = """
server: {endpoint: "@ENDPOINT@"}
placement:
  pools: [{name: main, max_tokens: 256, instances: auto}]
"""
# connect() or sendto() to an IPv4 or IPv6 address, as strace prints them.
ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


def off_host(trace: str) -> list[str]:
    calls = [
        line for line in trace.splitlines() if re.search(r"\b(connect|sendto|sendmsg)\(", line)
    ]
    found = []
    for line in calls:
        for v4, v6 in ADDRESS.findall(line):
            address = v4 or v6
            if not (address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")):
                found.append(line)
    return found


@pytest.mark.timeout(600)  # a first start's choice of model path, traced (below)
def test_a_serving_server_opens_no_connection_off_the_host(tmp_path):
    """The default config, as a user's first start runs it: `quantize: auto` chooses its
    path first, loading every runtime it races (OpenVINO's telemetry would go out there),
    minutes under strace; then requests for 40 s."""
    trace = tmp_path / "strace.log"
    prefix = ("strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg", "-o", str(trace))
    server = server_.Server(tmp_path, CONFIG, prefix=prefix)
    supervisor = None
    try:
        server.wait_ready(timeout=500)
        supervisor = server.status()["supervisor"]["pid"]  # strace's child, not server.proc
        with Client(server.endpoint, timeout=30) as client:
            deadline = time.monotonic() + 40  # onnxruntime's first event went out within 10 s
            i = 0
            while time.monotonic() < deadline:
                i += 1
                client.embed(f"request {i}: is anyone listening?")
                time.sleep(0.1)
    finally:
        if supervisor is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGTERM)
            server.proc.wait(60)  # strace exits with the last process it traces
        server.stop()
    text = trace.read_text()
    assert "connect(" in text  # the trace saw the server's own sockets
    assert off_host(text) == []
