"""The frontend (router/frontend.py): a real process and real sockets, with bare ROUTERs
standing in for the shards."""

import contextlib
import os
import signal
import subprocess
import threading
import time

import msgpack
import pytest
import zmq

from numaserve.host.cpuset import Binding
from numaserve.processes.specs import FrontendSpec, Route
from numaserve.testing.ports import free_port
from numaserve.wire import protocol


@pytest.fixture
def frontend(tmp_path):
    """A frontend pinned to CPU 1 and node 0, as on a reserved core; a shard and a client
    connected to it."""
    spec = FrontendSpec(
        endpoint=f"tcp://127.0.0.1:{free_port()}",
        routes=(Route("default", f"ipc://{tmp_path}/frontend.sock"),),
        max_message_bytes=1 << 20,
        binding=Binding.of([1], [0]),
    )
    proc = subprocess.Popen(spec.argv())
    ctx = zmq.Context()
    shard, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    shard.connect(spec.routes[0].shards)
    client.connect(spec.endpoint)
    for sock in (shard, client):
        sock.linger = 0
        sock.rcvtimeo = 10_000
    yield proc, shard, client
    ctx.destroy(linger=0)
    proc.kill()
    proc.wait()


def round_trip(shard, client, body: bytes) -> bytes:
    client.send_multipart([b"v1", body])
    request = shard.recv_multipart()  # [frontend's id, client envelope, v1, body]
    assert request[-2:] == [b"v1", body]
    shard.send_multipart([*request[:-1], b"re: " + body])
    return client.recv_multipart()[-1]


def test_a_frontend_on_reserved_cpus_runs_pinned_there_and_passes_requests_both_ways(frontend):
    proc, shard, client = frontend
    assert round_trip(shard, client, b"hello") == b"re: hello"
    with open(f"/proc/{proc.pid}/status") as status:
        assert "Cpus_allowed_list:\t1\n" in status.read()


def test_a_pinned_frontend_starts_over_under_numactl_so_all_its_memory_is_bound(frontend):
    # Bound in-process only, the interpreter's start-up pages stay wherever they first landed
    # (seen in the NUMA VM: a shard bound to node 0 with 334 pages on node 1).
    proc, shard, client = frontend
    round_trip(shard, client, b"hello")
    with open(f"/proc/{proc.pid}/environ", "rb") as environ:
        assert b"NUMASERVE_PINNED_BY=numactl" in environ.read().split(b"\0")


def test_sigterm_stops_the_frontend_while_requests_stream_through_it(frontend):
    proc, shard, client = frontend
    round_trip(shard, client, b"first")
    streaming = threading.Event()
    stop = threading.Event()

    def stream():  # the shard echoes, and the client keeps 64 requests in flight, until stopped
        poller = zmq.Poller()
        poller.register(shard, zmq.POLLIN)
        poller.register(client, zmq.POLLIN)
        for _ in range(64):
            client.send_multipart([b"v1", b"x"])
        while not stop.is_set():
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                if sock is shard:
                    shard.send_multipart(frames)
                else:
                    streaming.set()
                    client.send_multipart([b"v1", b"x"])

    pump = threading.Thread(target=stream)
    pump.start()
    try:
        assert streaming.wait(10)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(5) == 0
    finally:
        stop.set()
        pump.join()


@pytest.fixture
def two_models(tmp_path):
    """A frontend for two models, `toxicity` and `embed`, a stand-in shard of each, a client."""
    with by_model(tmp_path, "toxicity", "embed") as (shards, client, _):
        yield shards, client


@pytest.fixture
def one_model(tmp_path):
    """The frontend of a `models:` config that lists one model."""
    with by_model(tmp_path, "embed") as (shards, client, _):
        yield shards, client


def routes_spec(tmp_path, endpoint: str, *models: str) -> FrontendSpec:
    return FrontendSpec(
        endpoint=endpoint,
        routes=tuple(Route(m, f"ipc://{tmp_path}/frontend-{m}.sock") for m in models),
        max_message_bytes=1 << 20,
        by_model=True,
        routes_file=f"{tmp_path}/frontend-routes.json",
    )


@contextlib.contextmanager
def by_model(tmp_path, *models: str):
    """The frontend's process, a stand-in shard of each model connected, and a client."""
    spec = routes_spec(tmp_path, f"tcp://127.0.0.1:{free_port()}", *models)
    proc = subprocess.Popen(spec.argv())
    ctx = zmq.Context()
    shards = {route.model: ctx.socket(zmq.ROUTER) for route in spec.routes}
    client = ctx.socket(zmq.DEALER)
    for route in spec.routes:
        shards[route.model].connect(route.shards)
    client.connect(spec.endpoint)
    for sock in (*shards.values(), client):
        sock.linger = 0
        sock.rcvtimeo = 10_000
    for model, shard in shards.items():  # until the frontend has its connection from each
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            client.send_multipart(protocol.pack({"id": 0, "op": "ping", "model": model}))
            if shard.poll(200):
                shard.send_multipart([*shard.recv_multipart()[:-2], *protocol.pack({"id": 0})])
            if client.poll(1000) and "error" not in protocol.unpack(client.recv_multipart()):
                break  # answered by the shard, not no_instance from the frontend
    time.sleep(0.2)
    for sock in (*shards.values(), client):  # the pings that crossed on the way
        while sock.poll(0):
            sock.recv_multipart()
    try:
        yield shards, client, proc
    finally:
        ctx.destroy(linger=0)
        proc.kill()
        proc.wait()


def answered_by(shards, client, body: dict) -> str:
    """Which stand-in shard got `body`; it answers, and the answer reaches the client."""
    client.send_multipart(protocol.pack(body))
    poller = zmq.Poller()
    for sock in shards.values():
        poller.register(sock, zmq.POLLIN)
    (sock, _), *_ = poller.poll(10_000)
    request = sock.recv_multipart()
    assert protocol.unpack(request[-2:]) == body
    model = next(m for m, s in shards.items() if s is sock)
    sock.send_multipart([*request[:-2], *protocol.pack({"id": body["id"], "by": model})])
    assert protocol.unpack(client.recv_multipart()) == {"id": body["id"], "by": model}
    return model


def test_each_request_goes_to_the_shards_of_the_model_it_names(two_models):
    shards, client = two_models
    for i in range(4):
        for model in ("embed", "toxicity"):
            body = {"id": i, "op": "classify", "model": model, "texts": ["x"]}
            assert answered_by(shards, client, body) == model


def test_status_and_ping_name_no_model_and_go_to_the_first(two_models):
    shards, client = two_models
    assert answered_by(shards, client, {"id": 1, "op": "status"}) == "toxicity"
    assert answered_by(shards, client, {"id": 2, "op": "ping"}) == "toxicity"


@pytest.mark.parametrize(
    "model, message",
    [
        (None, "this server serves several models (toxicity, embed): name one in `model`"),
        ("spam", "no model 'spam' here; this server serves toxicity, embed"),
    ],
)
def test_a_text_request_for_no_model_or_an_unknown_one_is_answered_by_the_frontend(
    two_models, model, message
):
    shards, client = two_models
    body = {"id": 7, "op": "embed", "texts": ["x"]} | ({"model": model} if model else {})
    client.send_multipart(protocol.pack(body))
    reply = protocol.unpack(client.recv_multipart())
    assert (reply["id"], reply["error"]["code"], reply["error"]["message"]) == (
        7,
        "bad_request",
        message,
    )
    assert answered_by(shards, client, {"id": 8, "op": "embed", "model": "embed"}) == "embed"


def test_what_is_not_a_request_goes_to_a_router_to_be_judged(two_models):
    shards, client = two_models
    client.send_multipart([b"v1", b"\xc1 not msgpack"])
    poller = zmq.Poller()
    poller.register(shards["toxicity"], zmq.POLLIN)
    assert poller.poll(10_000)
    assert shards["toxicity"].recv_multipart()[-1] == b"\xc1 not msgpack"


def test_with_one_model_listed_a_request_that_names_none_is_for_it(one_model):
    shards, client = one_model
    assert answered_by(shards, client, {"id": 1, "op": "embed", "texts": ["x"]}) == "embed"
    assert answered_by(shards, client, {"id": 2, "op": "embed", "model": "embed"}) == "embed"


HOSTILE = [
    [b"v1"],
    [b"v1", b""],
    [b"v1", b"\xc1"],
    [b"v9", b"\x80"],
    [*protocol.pack({"id": 1, "op": "embed"}), b"extra"],
    [b"v1", msgpack.packb([1, 2, 3])],
    protocol.pack({"id": 2, "op": "embed", "model": 7, "texts": ["x"]}),
    protocol.pack({"id": 3, "op": "embed", "model": "m" * 100_000, "texts": ["x"]}),
    protocol.pack({"id": 4, "op": "embed", "model": None, "texts": ["x"]}),
    [b"v1", b"\x82\xa2id\xa1\xff\xa2op\xa5embed"],  # an id that is not UTF-8
]


def test_hostile_messages_leave_the_routing_frontend_serving(two_models):
    shards, client = two_models
    for frames in HOSTILE:
        client.send_multipart(frames)
    time.sleep(0.5)
    for sock in (*shards.values(), client):  # what the frontend passed on or answered
        while sock.poll(0):
            sock.recv_multipart()
    assert answered_by(shards, client, {"id": 9, "op": "embed", "model": "embed"}) == "embed"


def test_a_huge_unknown_model_name_is_not_echoed_back(two_models):
    shards, client = two_models
    body = {"id": 5, "op": "embed", "model": "m" * 100_000, "texts": ["x"]}
    client.send_multipart(protocol.pack(body))
    assert shards["toxicity"].poll(10_000)  # a router will say the name is not a name
    assert len(shards["toxicity"].recv_multipart()[-1]) > 100_000
    assert not client.poll(200)


def test_a_model_with_no_shard_up_is_answered_no_instance_and_the_others_serve_on(two_models):
    shards, client = two_models
    shards["toxicity"].close()  # its only shard is gone (being restarted)
    deadline, reply = time.monotonic() + 10, {}
    while time.monotonic() < deadline and "error" not in reply:  # once the frontend sees it
        client.send_multipart(protocol.pack({"id": 3, "op": "classify", "model": "toxicity"}))
        reply = protocol.unpack(client.recv_multipart()) if client.poll(500) else {}
    assert (reply["id"], reply["error"]["code"]) == (3, "no_instance")
    assert "no router shard of model 'toxicity' is up or keeping up" in reply["error"]["message"]
    rest = {"embed": shards["embed"]}
    assert answered_by(rest, client, {"id": 4, "op": "embed", "model": "embed"}) == "embed"


def test_sighup_with_new_routes_adds_and_removes_models_while_the_kept_one_serves(tmp_path):
    """A reload's routes (the new spec in routes_file): a socket for the added model, the
    removed model's closed, the kept model's requests flowing throughout."""
    with by_model(tmp_path, "toxicity", "embed") as (shards, client, proc):
        spec = routes_spec(tmp_path, "unused", "embed", "ner")
        with open(spec.routes_file, "w") as f:
            f.write(spec.to_json())
        proc.send_signal(signal.SIGHUP)
        ner = client.context.socket(zmq.ROUTER)
        ner.linger = 0
        ner.connect(spec.routes[1].shards)
        shards = {"embed": shards["embed"], "ner": ner}
        deadline, reply = time.monotonic() + 10, {"error": {}}
        while "error" in reply:  # until the frontend has taken up the new routes
            assert time.monotonic() < deadline, reply
            assert answered_by(shards, client, {"id": 1, "op": "embed", "model": "embed"})
            client.send_multipart(protocol.pack({"id": 2, "op": "ner", "model": "ner"}))
            if ner.poll(200):
                request = ner.recv_multipart()
                ner.send_multipart([*request[:-2], *protocol.pack({"id": 2})])
            reply = protocol.unpack(client.recv_multipart())
        body = {"id": 3, "op": "classify", "model": "toxicity", "texts": ["x"]}
        client.send_multipart(protocol.pack(body))
        reply = protocol.unpack(client.recv_multipart())
        assert reply["error"]["code"] == "bad_request"
        assert "serves embed, ner" in reply["error"]["message"]
        assert answered_by(shards, client, {"id": 4, "op": "ner", "model": "ner"}) == "ner"
        assert answered_by(shards, client, {"id": 5, "op": "embed", "model": "embed"}) == "embed"
        # status and ping go to the first model of the new order
        assert answered_by(shards, client, {"id": 6, "op": "status"}) == "embed"


def test_a_sighup_with_an_unreadable_routes_file_keeps_the_routes(tmp_path):
    with by_model(tmp_path, "toxicity", "embed") as (shards, client, proc):
        with open(f"{tmp_path}/frontend-routes.json", "w") as f:
            f.write("{not json")
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert proc.poll() is None
        assert answered_by(shards, client, {"id": 1, "op": "embed", "model": "embed"}) == "embed"
        body = {"id": 2, "op": "classify", "model": "toxicity"}
        assert answered_by(shards, client, body) == "toxicity"
