"""The frontend (router/frontend.py): a real process and real sockets, with a bare ROUTER
standing in for a shard."""

import os
import signal
import subprocess
import threading

import pytest
import zmq

from numaserve.specs import FrontendSpec
from tests.harness.cluster import free_port


@pytest.fixture
def frontend(tmp_path):
    """A frontend pinned to CPU 1 and node 0, as on a reserved core; a shard and a client
    connected to it."""
    spec = FrontendSpec(
        endpoint=f"tcp://127.0.0.1:{free_port()}",
        shards=f"ipc://{tmp_path}/frontend.sock",
        max_message_bytes=1 << 20,
        cpus=(1,),
        nodes=(0,),
    )
    proc = subprocess.Popen(spec.argv())
    ctx = zmq.Context()
    shard, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    shard.connect(spec.shards)
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
