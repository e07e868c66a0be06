"""The router's bounds, with the real router in a thread and stand-in workers (tests/stand_in.py):
deadlines, queue waits, load shedding and memory, each in a fraction of a second."""

import logging
import math
import time

import pytest
import zmq

from numaserve.wire import protocol
from tests.harness.stand_in import InProcessRouter


@pytest.fixture
def make_router(tmp_path):
    routers = []

    def make(**kw):
        routers.append(InProcessRouter(tmp_path, **kw))
        return routers[-1]

    yield make
    for r in routers:
        r.close()


def send(sock, request_id, text, **fields):
    body = {"id": request_id, "op": "embed", "texts": [text], **fields}
    sock.send_multipart(protocol.pack(body))


def replies(sock, count, timeout=10.0) -> dict:
    """The replies to `count` requests: {id: status or error code}."""
    out = {}
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert sock.poll(max(0, deadline - time.monotonic()) * 1000), f"only {len(out)} replies"
        body = protocol.unpack(sock.recv_multipart())
        out[body["id"]] = body["status"] if body["status"] == "ok" else body["error"]["code"]
    return out


def test_answered_requests_leave_the_deadline_heap(make_router):
    r = make_router(instances=2, queue_size=4096)
    sock = r.client_socket()
    for i in range(2000):
        send(sock, i, f"distinct text number {i}", deadline_ms=600_000)
    assert set(replies(sock, 2000).values()) == {"ok"}
    assert not r.router.book.active
    assert len(r.router.book.deadlines) <= 200  # not 2000 until their deadlines pass


@pytest.mark.parametrize("deadline", [math.nan, math.inf, 1e300])
def test_a_refused_absurd_deadline_leaves_deadlines_working(make_router, deadline):
    r = make_router(instances=1, delay=0.5)
    sock = r.client_socket()
    send(sock, "busy", "a text that keeps the one instance busy for half a second")
    time.sleep(0.05)
    send(sock, "absurd", "a text with an absurd deadline", deadline_ms=deadline)
    send(sock, "short", "a text with a short deadline", deadline_ms=50)
    got = replies(sock, 3)
    assert got == {"busy": "ok", "absurd": "bad_request", "short": "deadline_exceeded"}


def test_a_request_without_a_deadline_waits_at_most_max_queue_ms(make_router):
    # One at a time, each run 1 s: the four behind the first are refused at 0.4 s, not run
    # after 1, 2, 3 and 4 s. (The first is dispatched at once, well within 0.4 s even on a
    # busy machine: a queue wait of 0.1 s was not, beside a second test worker.)
    r = make_router(instances=1, delay=1.0, max_queue_ms=400, max_batch=1)
    sock = r.client_socket()
    started = time.monotonic()
    for i in range(5):
        send(sock, i, f"queued text {i}")
    got = replies(sock, 5)
    assert sorted(got.values()) == ["ok"] + ["overloaded"] * 4
    assert time.monotonic() - started < 1.9


def test_a_full_queue_refuses_before_tokenizing(make_router):
    r = make_router(instances=1, delay=1.0, queue_size=1)
    sock = r.client_socket()
    send(sock, "running", "the text that runs")
    time.sleep(0.05)
    send(sock, "queued", "the text that waits")
    time.sleep(0.05)
    for i in range(50):
        send(sock, i, f"refused {i} " + "word " * 20_000)
    got = replies(sock, 50, timeout=0.9)  # all before the running text is done
    assert set(got.values()) == {"overloaded"}
    assert not any(text.startswith("refused") for text in r.router.book.tokenizer.memo)
    assert replies(sock, 2) == {"running": "ok", "queued": "ok"}


def test_a_worker_that_said_bye_is_forgotten_without_a_warning(make_router, caplog):
    r = make_router(instances=2)
    worker = r.workers[0]
    bye = r.ctx.socket(__import__("zmq").DEALER)
    worker.running = False
    worker.join(5)
    with caplog.at_level(logging.INFO, logger="numaserve.router"):
        # A stand-in's identity is random; a graceful stop is READY, BYE, silence.
        bye.connect(r.router.spec.workers_endpoint)
        ready = {"type": protocol.READY, "name": "leaving-0", "pool": "main", "pid": 0}
        bye.send_multipart(protocol.pack(ready))
        bye.send_multipart(protocol.pack({"type": protocol.BYE}))
        time.sleep(0.1)
        bye.close(linger=100)
        deadline = time.monotonic() + 5
        while any(w.name == "leaving-0" for w in list(r.router.dispatch.workers.values())):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert "instance leaving-0 stopped" in caplog.text
    assert "leaving-0 missed" not in caplog.text


@pytest.mark.parametrize(
    "ready",
    [
        {"name": "odd-0", "pool": "main"},  # no pid
        {"name": "odd-0", "pool": "main", "pid": "12"},
        {"name": "odd-0", "pool": "main", "pid": 12, "binding": {"cpus": [0, "1"], "nodes": [0]}},
        {"name": "odd-0", "pool": "main", "pid": 12, "binding": {"cpus": [0], "mems": [0]}},
        {"name": "odd-0", "pool": "main", "pid": 12, "labels": "POSITIVE"},
        {"name": 7, "pool": "main", "pid": 12},
    ],
)
def test_a_ready_of_another_shape_is_refused_said_and_the_router_goes_on(
    make_router, caplog, ready
):
    r = make_router(instances=1)
    odd = r.ctx.socket(__import__("zmq").DEALER)
    with caplog.at_level(logging.WARNING, logger="numaserve.router"):
        odd.connect(r.router.spec.workers_endpoint)
        odd.send_multipart(protocol.pack({"type": protocol.READY} | ready))
        deadline = time.monotonic() + 5
        while "ignored a READY" not in caplog.text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    odd.close(linger=0)
    assert all(w.name != "odd-0" for w in list(r.router.dispatch.workers.values()))
    sock = r.client_socket()
    send(sock, 1, "still served")
    assert replies(sock, 1) == {1: "ok"}


def test_a_message_that_fails_unforeseen_is_counted_logged_once_and_the_router_goes_on(
    make_router, caplog
):
    r = make_router(instances=1)
    encode = r.router.book.tokenizer.encode

    def tokenizer_bug(
        texts, truncate=None, left=False
    ):  # a stand-in for a bug no test has found yet
        if texts == ["boom"]:
            raise RuntimeError("an unforeseen bug")
        return encode(texts, truncate)

    r.router.book.tokenizer.encode = tokenizer_bug
    sock = r.client_socket()
    with caplog.at_level(logging.ERROR, logger="numaserve.router"):
        for i in range(3):
            send(sock, f"boom {i}", "boom")
        send(sock, "fine", "a fine text")
        assert replies(sock, 1) == {"fine": "ok"}
    assert r.router.own_status().requests["internal_errors"] == 3
    assert caplog.text.count("failed in the router and were dropped") == 1
    assert "RuntimeError: an unforeseen bug" in caplog.text


def test_a_router_just_started_holds_texts_until_its_instances_announce_themselves(make_router):
    r = make_router(instances=1, start_workers=False)  # as after a router restart
    sock = r.client_socket()
    send(sock, "early", "a text sent before any instance is known")
    time.sleep(0.3)
    r.start_workers()
    assert replies(sock, 1) == {"early": "ok"}


def test_texts_for_no_instance_at_all_fail_once_the_hold_is_over(make_router):
    r = make_router(instances=1, start_workers=False)
    sock = r.client_socket()
    send(sock, "orphan", "nobody will ever serve this")
    started = time.monotonic()
    assert replies(sock, 1) == {"orphan": "no_instance"}
    assert time.monotonic() - started < 5


def test_a_shard_loses_no_reply_while_its_frontend_falls_behind(make_router, tmp_path):
    """The frontend always reads its shards (it drops only towards clients that do not read),
    so a shard must queue its replies for it however far behind it falls: CPU starvation
    under overload once made a shard drop replies at libzmq's send high-water mark."""
    frontend = f"ipc://{tmp_path}/frontend.sock"
    ctx = zmq.Context.instance()
    stand_in = ctx.socket(zmq.DEALER)  # the frontend's side: envelope, version, body
    stand_in.linger = 0
    stand_in.bind(frontend)
    r = make_router(frontend=frontend)
    count = 20_000  # more than libzmq's default high-water marks and the socket buffer hold
    for i in range(count):
        stand_in.send_multipart([b"client", *protocol.pack({"id": i, "op": "ping"})])
    deadline = time.monotonic() + 30
    while r.router.book.counters["requests"] < count:  # all answered, none read yet
        assert time.monotonic() < deadline, r.router.book.counters
        time.sleep(0.05)
    answered = set()
    while stand_in.poll(1000):
        answered.add(protocol.unpack(stand_in.recv_multipart()[1:])["id"])
    stand_in.close()
    assert len(answered) == count


def test_a_result_cached_from_a_model_no_live_instance_runs_is_never_answered(make_router):
    """A reload rolls the instances to a changed model (a new checkpoint directory) while the
    shard runs on: once the last instance of the old model is gone, its cached results must
    not answer for the new one."""
    old, new = (protocol.embedding_to_wire([v] * 4) for v in (0.25, 0.75))
    r = make_router(instances=0, heartbeat_liveness=1)
    r.add_worker("main-0", ready={"model_key": "checkpoint-v1"}, vector=old)
    sock = r.client_socket()
    send(sock, 1, "the same text, twice")
    assert embeddings(sock) == {1: old}
    r.workers[0].running = False  # gone: it stops heartbeating, and the router drops it
    r.add_worker("main-1", ready={"model_key": "checkpoint-v2"}, vector=new)
    deadline = time.monotonic() + 10
    while len(r.router.dispatch.workers) > 1:
        assert time.monotonic() < deadline, "main-0 was never dropped"
        time.sleep(0.05)

    send(sock, 2, "the same text, twice")

    assert embeddings(sock) == {2: new}


def embeddings(sock) -> dict:
    body = protocol.unpack(sock.recv_multipart())
    return {body["id"]: body["results"][0]["embedding"]}


def test_a_shard_without_a_slot_table_yet_answers_status_as_the_whole_server(make_router, tmp_path):
    """A shard among several (just restarted: no slot table from the supervisor yet) has no one
    to merge the others' parts; it answers in the whole server's shape all the same, its own
    part alone, as `numaserve status` and scripts read it."""
    frontend = f"ipc://{tmp_path}/frontend.sock"
    stand_in = zmq.Context.instance().socket(zmq.DEALER)  # the frontend's side
    stand_in.linger = 0
    stand_in.bind(frontend)
    make_router(frontend=frontend)
    stand_in.send_multipart([b"client", *protocol.pack({"id": 1, "op": "status"})])
    assert stand_in.poll(10_000)
    reply = protocol.unpack(stand_in.recv_multipart()[1:])
    stand_in.close()
    assert [shard["shard"] for shard in reply["server"]["shards"]] == [0]
