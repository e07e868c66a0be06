"""The HTTP front's parts, each alone: the config's rules for server.http, the API keys file,
the HTTP/1.1 connection (over a real socket, with a route that echoes), and the shapes routes
read and write. The whole front against a real server: tests/test_http.py."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import orjson
import pytest

from numaserve.config.keys_file import KeysFileError, read_keys
from numaserve.config.schema import ConfigError, parse_config
from numaserve.front.errors import ApiError
from numaserve.front.inputs import embeddings
from numaserve.front.keys import ApiKeys
from numaserve.http import api_errors
from numaserve.http.connection import Connection, Request, Response, sweep
from numaserve.http.routes.tei import predict_inputs
from tests.harness.console import numaserve

# -- config --------------------------------------------------------------------------------


def test_an_http_address_other_hosts_reach_needs_keys_or_insecure():
    with pytest.raises(ConfigError, match=r"server\.http: 0\.0\.0\.0:8080 can be reached"):
        parse_config('server: {http: "0.0.0.0:8080"}')
    keyed = parse_config('server: {http: "0.0.0.0:8080", http_api_keys_file: /etc/keys}')
    assert keyed.server.http == "0.0.0.0:8080"
    assert parse_config('server: {http: "0.0.0.0:8080", insecure: true}').server.insecure


def test_http_is_on_loopback_by_default_and_empty_turns_it_off():
    assert parse_config("{}").server.http == "127.0.0.1:8080"
    assert parse_config('server: {http: ""}').server.http == ""


def test_an_http_address_that_is_not_host_port_is_refused_naming_an_example():
    with pytest.raises(ConfigError, match=r"server.http: expected host:port, like 127.0.0.1:8080"):
        parse_config('server: {http: "http://localhost:8080"}')


# -- API keys ------------------------------------------------------------------------------

KEY = "k" * 24


def test_a_request_needs_a_listed_key_as_a_bearer_token(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# comment\n\n  {KEY}  \nshort\n")
    keys = ApiKeys(str(path))
    keys.check(f"Bearer {KEY}")
    keys.check(f"bearer {KEY}")
    for header in (None, "", KEY, "Bearer ", f"Basic {KEY}", "Bearer short", f"Bearer {KEY}x"):
        with pytest.raises(ApiError) as refused:
            keys.check(header)
        assert refused.value.status == 401


def test_a_key_marked_bulk_makes_its_requests_bulk_by_default(tmp_path):
    path = tmp_path / "keys"
    indexer = "i" * 24
    path.write_text(f"{KEY}\n{indexer}   bulk\n")
    keys = ApiKeys(str(path))
    keys.check(f"Bearer {indexer}")
    assert keys.is_bulk(f"Bearer {indexer}") and not keys.is_bulk(f"Bearer {KEY}")


def test_a_keys_file_line_with_another_word_after_the_key_is_refused_naming_it(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY}\n{'k' * 20} batch\n")
    with pytest.raises(KeysFileError, match="line 2: after the key comes nothing, or `bulk`"):
        read_keys(str(path))


def test_a_key_too_short_to_be_listed_is_refused_saying_so(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY}\n")
    with pytest.raises(ApiError, match="shorter than 16 characters") as refused:
        ApiKeys(str(path)).check("Bearer short")
    assert refused.value.status == 401


def test_start_refuses_a_keys_file_with_a_short_key_naming_its_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"# the ops team\n{KEY}\nhunter2\n")
    config = tmp_path / "c.yaml"
    config.write_text(f'server: {{http: "127.0.0.1:8080", http_api_keys_file: "{path}"}}\n')
    out = numaserve("start", "--config", config)
    assert out.returncode == 2, out.stderr
    assert f"{path}: line 3: a key shorter than 16 characters" in out.stderr
    assert "spawn" not in out.stderr


def test_a_key_added_to_the_file_is_accepted_once_it_is_read_again(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY}\n")
    keys = ApiKeys(str(path))
    new = "n" * 20
    path.write_text(f"{KEY}\n{new}\n")
    keys.checked = time.monotonic() - 2  # a second has passed
    keys.check(f"Bearer {new}")


def test_an_unreadable_keys_file_keeps_the_keys_it_had(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{KEY}\n")
    keys = ApiKeys(str(path))
    path.unlink()
    keys.checked = 0
    keys.check(f"Bearer {KEY}")


def test_without_a_keys_file_every_request_is_let_in():
    ApiKeys(None).check(None)


def test_a_reload_without_a_keys_file_reads_nothing_and_still_lets_every_request_in(caplog):
    keys = ApiKeys(None)
    keys.stamp = None  # what SIGHUP does (Front.reload_keys), a server reload among its causes
    keys.reload()
    keys.check(None)
    assert not caplog.records


# -- the connection, over a real socket ------------------------------------------------------


class EchoServer:
    """A Connection on a real loopback socket, whose one route answers the body it read (after
    `delay` seconds): what the connection does alone, with no router behind it."""

    def __init__(self, max_body=1024, read_timeout=0.5, delay=0.0):
        self.loop = asyncio.new_event_loop()
        self.live: set = set()
        self.delay = delay

        async def handle(request: Request) -> Response:
            await asyncio.sleep(self.delay)
            return Response(
                200, orjson.dumps({"path": request.path, "body": request.body.decode()})
            )

        def connection():
            return Connection(
                handle, api_errors.refusal, (max_body, read_timeout), lambda: False, self.live
            )

        self.server = self.loop.run_until_complete(
            self.loop.create_server(connection, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.loop.call_soon(sweep, self.live)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def ask(self, data: bytes, close: bool = False, wait: float = 2.0) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait) as sock:
            sock.sendall(data)
            if close:
                sock.shutdown(socket.SHUT_WR)
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except TimeoutError:
                pass
        return answer

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.stop()


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def test_pipelined_requests_are_answered_in_order_on_one_connection(echo):
    answer = echo.ask(post("/a", b"1") + post("/b", b"22") + post("/c", b"333"), wait=0.5)
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert [orjson.loads(b)["path"] for b in bodies] == ["/a", "/b", "/c"]


def test_a_body_over_the_limit_is_refused_413_by_its_length_before_it_is_read(echo):
    answer = echo.ask(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer


def test_a_chunked_body_over_the_limit_is_refused_413_as_it_comes(echo):
    chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
    head = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert echo.ask(head + chunk * 2 + b"0\r\n\r\n").startswith(b"HTTP/1.1 413 ")


def test_a_request_not_read_whole_in_time_is_408(echo):
    started = time.monotonic()
    answer = echo.ask(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", wait=3)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < 2


def test_huge_headers_are_431_and_malformed_http_400(echo):
    assert echo.ask(b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n").startswith(
        b"HTTP/1.1 431 "
    )
    assert echo.ask(b"NOT HTTP AT ALL\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def test_expect_100_continue_is_answered_before_the_body(echo):
    answer = echo.ask(post("/a", b"hi", b"Expect: 100-continue\r\n"), wait=0.5)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 ")


def test_a_half_request_then_a_closed_side_is_400(echo):
    answer = echo.ask(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Le", close=True)
    assert answer.startswith(b"HTTP/1.1 400 ")


def test_a_client_that_hangs_up_cancels_its_route_and_gets_nothing():
    server = EchoServer(delay=5.0)
    try:
        server.ask(post("/a", b"1"), close=True, wait=0.5)
        time.sleep(0.2)
        assert not server.live  # the connection is gone, its route's task cancelled with it
    finally:
        server.stop()


# -- shapes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "texts", "single"),
    [
        ("a", ["a"], True),
        (["a"], ["a"], True),
        (["a", "b"], [["a", "b"]], True),
        ([["a"], ["a", "b"]], ["a", ["a", "b"]], False),
    ],
)
def test_predict_reads_teis_text_pair_and_batch(inputs, texts, single):
    assert predict_inputs(inputs) == (texts, single)


@pytest.mark.parametrize("inputs", [None, [], ["a", "b", "c"], [["a", "b", "c"]], [1], {"a": 1}])
def test_predict_refuses_what_tei_refuses(inputs):
    with pytest.raises(ApiError) as refused:
        predict_inputs(inputs)
    assert refused.value.status == 422


def test_dimensions_cut_an_embedding_and_scale_it_back_to_unit_length():
    vector = np.array([3.0, 4.0, 12.0], dtype="<f4")
    (cut,) = embeddings([{"embedding": vector.tobytes()}], 2, normalize=False)
    np.testing.assert_allclose(cut, [0.6, 0.8], rtol=1e-6)
    (whole,) = embeddings([{"embedding": vector.tobytes()}], None, normalize=False)
    np.testing.assert_array_equal(whole, vector)
    with pytest.raises(ApiError, match="dimensions is 4"):
        embeddings([{"embedding": vector.tobytes()}], 4, normalize=True)
