"""What the router logs of its client connections: what happened, not every possible cause.
The real router in a thread (tests/harness/stand_in.py), real client sockets."""

import logging
import socket
import time

import pytest

from numaserve.client import Client
from tests.harness.stand_in import InProcessRouter


@pytest.fixture
def router(tmp_path):
    made = InProcessRouter(tmp_path)
    yield made
    made.close()


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "it never happened"
        time.sleep(0.02)


def router_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "numaserve.router"]


def counts(router) -> dict:
    return router.router.connections.counts()


def test_a_client_that_leaves_is_logged_as_a_closed_connection_and_nothing_more(router, caplog):
    caplog.set_level(logging.DEBUG, logger="numaserve.router")
    with Client(router.endpoint) as client:
        client.ping()
    wait_for(lambda: counts(router)["client_disconnects"] == 1)
    router.router.connections.flush(time.monotonic() + 60)
    lines = router_lines(caplog)
    assert any("1 client connection(s) closed (1 in all)" in line for line in lines), lines
    assert not any("max_message_bytes" in line or "CurveZMQ" in line for line in lines), lines
    assert counts(router)["refused_handshakes"] == 0


def test_a_connection_closed_before_the_handshake_is_no_refusal_and_no_warning(router, caplog):
    """A port check (a load balancer's TCP probe) opens and closes without a word of ZMTP."""
    caplog.set_level(logging.DEBUG, logger="numaserve.router")
    port = int(router.endpoint.rsplit(":", 1)[1])
    socket.create_connection(("127.0.0.1", port)).close()
    wait_for(lambda: counts(router)["client_disconnects"] == 1)
    router.router.connections.flush(time.monotonic() + 60)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, [r.getMessage() for r in warnings]
    assert counts(router)["refused_handshakes"] == 0


# A ZMTP 3.1 greeting asking for CURVE (rfc.zeromq.org/spec/23): signature, version,
# mechanism (20 bytes), as-server, filler. Sent raw, so that the router always reads it: a
# libzmq CURVE client may see the mismatch in the router's greeting first and close before
# its own is read (then the router sees only a closed connection).
CURVE_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"CURVE".ljust(20, b"\0") + bytes(32)


def test_a_curve_client_at_a_plaintext_server_is_logged_as_a_mechanism_mismatch(router, caplog):
    caplog.set_level(logging.DEBUG, logger="numaserve.router")
    port = int(router.endpoint.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as peer:
        peer.sendall(CURVE_GREETING)
        wait_for(lambda: counts(router)["refused_handshakes"] >= 1)
    router.router.connections.flush(time.monotonic() + 60)
    refused = [line for line in router_lines(caplog) if "handshake" in line]
    assert refused and all("server.curve is not set" in line for line in refused), refused
    assert not any("authorized_keys_dir" in line for line in router_lines(caplog))
