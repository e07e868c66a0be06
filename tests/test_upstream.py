"""A front's way to the router shards (numaserve/front/upstream.py), against a real router
shard in a thread with stand-in workers (tests/harness/stand_in.py): a request a shard holds
is sent again after its window, and given up after a second; a big request's window grows
with its texts, so that one served a piece at a time by a busy instance is answered."""

import asyncio

import pytest
import zmq

from tests.harness.stand_in import InProcessRouter

RUN_S = 0.05  # each stand-in run; with max_batch 1, a request of n texts takes n runs


@pytest.fixture
def slow_router(tmp_path):
    made = InProcessRouter(tmp_path, delay=RUN_S, max_batch=1, local=f"ipc://{tmp_path}/local.sock")
    yield made
    made.close()


def ask(router: InProcessRouter, texts: int, retry_after_s: float, per_text_s: float) -> dict:
    from numaserve.front.upstream import Upstream

    async def call() -> dict:
        upstream = Upstream(ctx, {"default": (router.spec.local,)}, retry_after_s, per_text_s)
        upstream.start(asyncio.get_running_loop())
        try:
            # A send before the connection is up is answered at once (no shard is up): wait.
            while (await upstream.call("default", {"op": "ping"}))["status"] != "ok":
                await asyncio.sleep(0.05)
            body = {"op": "embed", "texts": [f"text {i}" for i in range(texts)]}
            return await asyncio.wait_for(upstream.call("default", body), timeout=30)
        finally:
            upstream.close()

    ctx = zmq.Context()
    try:
        return asyncio.run(call())
    finally:
        ctx.destroy(linger=0)


def test_a_big_request_a_busy_instance_serves_a_piece_at_a_time_is_answered(slow_router):
    reply = ask(slow_router, texts=40, retry_after_s=0.5, per_text_s=0.1)  # 2 s of runs

    assert "error" not in reply, reply
    assert len(reply["results"]) == 40


def test_a_request_no_shard_answers_is_given_up_after_two_windows(slow_router):
    for worker in slow_router.workers:
        worker.running = False  # the instance stops answering, the shard holds the request

    reply = ask(slow_router, texts=1, retry_after_s=0.3, per_text_s=0.0)

    assert reply["error"] == {
        "code": "no_instance",
        "message": "no router shard answered; the server logged why",
    }


def test_the_pieces_of_one_big_request_are_not_sent_again_while_the_shard_works_through_them(
    slow_router, caplog
):
    """Two pieces of 20 texts at once: 40 runs, 2 s. Each piece's window allows for the
    other's texts too (0.5 + 0.04 x 40 = 2.1 s); on its own texts alone (1.3 s) it was sent
    again, and its texts run twice."""
    from numaserve.front.upstream import Upstream

    async def call() -> list[dict]:
        upstream = Upstream(ctx, {"default": (slow_router.spec.local,)}, 0.5, 0.04)
        upstream.start(asyncio.get_running_loop())
        try:
            while (await upstream.call("default", {"op": "ping"}))["status"] != "ok":
                await asyncio.sleep(0.05)
            pieces = [
                {"op": "embed", "texts": [f"piece {p} text {i}" for i in range(20)]}
                for p in range(2)
            ]
            calls = [upstream.call("default", piece, texts_ahead=20) for piece in pieces]
            return await asyncio.wait_for(asyncio.gather(*calls), timeout=30)
        finally:
            upstream.close()

    ctx = zmq.Context()
    try:
        with caplog.at_level("WARNING", logger="numaserve.front"):
            replies = asyncio.run(call())
    finally:
        ctx.destroy(linger=0)
    assert [len(r["results"]) for r in replies] == [20, 20]
    assert "sent again" not in caplog.text
