"""A list of texts longer than the server takes in one request: the client library sends it in
pieces within the server's limits (server.max_texts, server.max_message_bytes, which it asks
once) and answers one list, in order. A real router in this process, stand-in workers."""

import asyncio

import pytest

from numaserve.client import AsyncClient, Client
from numaserve.client.calls import Calls
from tests.harness.stand_in import InProcessRouter


@pytest.fixture
def router(tmp_path):
    router = InProcessRouter(tmp_path, instances=2, max_texts=50, max_message_bytes=8192)
    yield router
    router.close()


def requests_served(router) -> int:
    """Text requests answered (a ping is answered by the loop, not counted here)."""
    return router.router.book.counters["replies_ok"]


def test_a_list_over_max_texts_is_sent_in_pieces_and_answered_in_order(router):
    texts = [f"text number {i}" + " word" * (i % 7) for i in range(130)]
    with Client(router.endpoint, timeout=10) as client:
        answered = client.embed(texts)
    assert [e.tokens for e in answered] == [5 + i % 7 for i in range(130)]
    assert requests_served(router) == 3  # 50, 50 and 30 (and a ping that asked the limits)


def test_a_list_over_the_message_limit_is_sent_in_pieces_of_that_size(router):
    texts = [f"passage {i}: " + "many words here " * 30 for i in range(40)]  # 500 bytes each
    with Client(router.endpoint, timeout=10) as client:
        answered = client.embed(texts)
    assert len(answered) == 40 and all(e.tokens > 90 for e in answered)
    assert requests_served(router) >= 3  # 8,192 bytes hold at most 16 of them


def test_the_asyncio_client_sends_a_long_list_in_pieces_too(router):
    async def main():
        async with AsyncClient(router.endpoint, timeout=10) as client:
            return await client.embed([f"text {i}" for i in range(120)])

    assert len(asyncio.run(main())) == 120
    assert requests_served(router) == 3


def test_a_short_list_asks_no_limits_and_goes_as_one_request(router):
    with Client(router.endpoint, timeout=10) as client:
        assert len(client.embed(["a", "b", "c"])) == 3
        assert client.max_texts is None
    assert requests_served(router) == 1


def pieces(texts, max_texts=0, max_message_bytes=0, op="embed", **fields):
    calls = Calls.__new__(Calls)  # the splitting alone: no sockets
    calls.max_texts, calls.max_message_bytes = max_texts, max_message_bytes
    return calls.pieces(op, texts, fields)


def test_pieces_hold_at_most_max_texts_and_token_vectors_64():
    assert [len(p) for p in pieces(["t"] * 250, max_texts=100)] == [100, 100, 50]
    assert [len(p) for p in pieces(["t"] * 150, 2048, token_vectors=True)] == [64, 64, 22]
    assert [len(p) for p in pieces(["t"] * 100, 2048, op="multivector")] == [64, 36]
    assert pieces(["only"], max_texts=0) == [["only"]]


def test_a_text_over_the_message_limit_goes_alone_to_be_refused_as_too_large():
    big, small = "x" * 10_000, "y" * 10
    split = pieces([small, big, small], max_message_bytes=8192)
    assert split == [[small], [big], [small]]
