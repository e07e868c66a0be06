"""What the client library says when no answer can come: nothing listening, a refused
handshake, a request over the server's size limit, a bad argument. Real sockets: a free port,
a bound ROUTER that never answers, a CurveZMQ ROUTER, and the real router in a thread."""

import asyncio
import contextlib
import socket
import threading
import time

import pytest
import zmq

from numaserve.client import (
    AsyncClient,
    Client,
    HandshakeFailed,
    Timeout,
    TooLarge,
    Unreachable,
)
from numaserve.testing.ports import free_port
from tests.harness.stand_in import InProcessRouter


@pytest.fixture
def silent_endpoint():
    """A ROUTER that takes connections and never answers: a server that is there but slow."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close()


@pytest.fixture
def closing_endpoint():
    """A TCP port that accepts each connection and closes it at once: a proxy or a port
    forward with no server behind it (QEMU's, a load balancer's)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept_and_close():
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                listener.accept()[0].close()

    thread = threading.Thread(target=accept_and_close, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    listener.close()


@pytest.fixture
def curve_endpoint():
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.curve_server = True
    sock.curve_secretkey = zmq.curve_keypair()[1]
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}"
    sock.close()


def test_nothing_listening_is_said_within_about_two_seconds():
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with Client(endpoint, timeout=5, retries=3) as client, pytest.raises(Unreachable) as e:
        client.status()
    assert time.monotonic() - start < 3.5  # not 4 tries of 5 s
    assert f"nothing is answering at {endpoint}" in str(e.value)
    assert "curve" not in str(e.value).lower()


def test_nothing_listening_is_said_even_when_each_try_is_shorter_than_the_connect_wait():
    client = Client(f"tcp://127.0.0.1:{free_port()}", timeout=0.3, retries=1)
    with client, pytest.raises(Unreachable):
        client.ping()


def test_the_async_client_says_nothing_is_listening_too():
    async def ask():
        async with AsyncClient(f"ipc:///tmp/numaserve-nothing-{free_port()}") as client:
            await client.embed("anyone there?")

    start = time.monotonic()
    with pytest.raises(Unreachable):
        asyncio.run(ask())
    assert time.monotonic() - start < 3.5


def test_connections_closed_at_once_are_said_to_close_before_the_handshake(closing_endpoint):
    """What a client sees of a CURVE server, or of a proxy with nothing behind it: no word of
    ZMTP, then a closed connection. Both causes are named."""
    start = time.monotonic()
    with Client(closing_endpoint, timeout=5) as client, pytest.raises(HandshakeFailed) as e:
        client.ping()
    assert time.monotonic() - start < 3.5
    message = str(e.value)
    assert "closed the connection before the ZeroMQ handshake ended" in message
    assert "server.curve" in message and "proxy" in message


def test_a_server_that_takes_the_connection_but_never_answers_is_retried_then_a_timeout(
    silent_endpoint,
):
    start = time.monotonic()
    with Client(silent_endpoint, timeout=0.4, retries=2) as client, pytest.raises(Timeout) as e:
        client.ping()
    assert type(e.value) is Timeout  # not Unreachable: something is there
    assert time.monotonic() - start >= 1.2  # every try was made
    assert "3 tries" in str(e.value) and "curve" not in str(e.value).lower()


def test_a_plaintext_client_at_a_curve_server_is_told_the_handshake_failed(curve_endpoint):
    start = time.monotonic()
    with Client(curve_endpoint, timeout=5) as client, pytest.raises(HandshakeFailed) as e:
        client.ping()
    assert time.monotonic() - start < 1.5
    assert "server.curve" in str(e.value) and "--server-key" in str(e.value)


def test_a_request_over_the_servers_limit_is_refused_before_sending_naming_size_and_limit(
    tmp_path,
):
    router = InProcessRouter(tmp_path, max_message_bytes=4096)
    try:
        with Client(router.endpoint, timeout=5) as client:
            with pytest.raises(TooLarge) as e:
                client.embed("x" * 10_000)
            assert "10,0" in str(e.value) and "4,096" in str(e.value)
            assert "server.max_message_bytes" in str(e.value)
            assert client.embed("a short text after it").tokens > 0
    finally:
        router.close()


def test_a_request_over_a_limit_given_to_the_client_is_refused_without_asking_the_server():
    client = Client(f"tcp://127.0.0.1:{free_port()}", max_message_bytes=2048)
    with client, pytest.raises(TooLarge):  # not Unreachable: nothing was sent
        client.embed("y" * 3000)  # a list of such texts is sent a text at a time


@pytest.mark.parametrize(
    "call, argument, error",
    [
        (lambda c: c.classify(None), "texts", TypeError),
        (lambda c: c.embed(42), "texts", TypeError),
        (lambda c: c.embed(["fine", None]), "texts", TypeError),
        (lambda c: c.embed(("a", "pair")), "texts", TypeError),
        (lambda c: c.embed({"a", "set"}), "texts", TypeError),
        (lambda c: c.classify([("a", "b", "c")]), "texts", TypeError),
        (lambda c: c.rerank(None, ["doc"]), "query", TypeError),
        (lambda c: c.rerank("query", "one document"), "documents", TypeError),
        (lambda c: c.rerank("query", ["doc"], top_k=0), "top_k", ValueError),
        (lambda c: c.ner("text", aggregation="loud"), "aggregation", ValueError),
        (lambda c: c.embed("text", deadline_ms=-5), "deadline_ms", ValueError),
    ],
)
def test_a_bad_argument_is_an_error_naming_it_before_anything_is_sent(call, argument, error):
    client = Client(f"tcp://127.0.0.1:{free_port()}")
    with client, pytest.raises(error, match=f"^{argument}: "):
        call(client)


@pytest.mark.parametrize(
    "settings, argument",
    [
        ({"endpoints": []}, "endpoints"),
        ({"endpoints": [None]}, "endpoints"),
        ({"timeout": 0}, "timeout"),
        ({"retries": -1}, "retries"),
        ({"connect_timeout": "2"}, "connect_timeout"),
        ({"model": 3}, "model"),
    ],
)
def test_a_bad_client_setting_is_an_error_naming_it(settings, argument):
    with pytest.raises((TypeError, ValueError), match=f"^{argument}: "):
        Client(**{"endpoints": "tcp://127.0.0.1:5555", **settings})


def test_a_server_that_does_not_say_its_limit_gets_the_request(tmp_path):
    router = InProcessRouter(tmp_path)
    try:
        with Client(router.endpoint, timeout=5, max_message_bytes=0) as client:  # 0: not told
            assert client.embed("y" * 2000).tokens > 0
    finally:
        router.close()
