"""A client with several servers sends to all of them: the least busy first, in turn among
equals; a server that stops answering is set aside and taken back once it answers again; a
host name stands for every address it resolves to.

The first tests drive client/endpoints.py alone, with a clock and a resolver the test gives
(no time passes, no DNS is asked). The others run real routers in threads (stand-in workers
count what each served) and real client sockets."""

import asyncio
import time

import pytest

from numaserve.client import AsyncClient, Client
from numaserve.client.endpoints import ASIDE_S, Endpoints, resolve, tcp_host
from numaserve.testing.ports import free_port
from tests.harness.stand_in import InProcessRouter

A, B, C = "tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"
NAMED = "tcp://numaserve.default.svc:5555"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(*given, resolver=None, clock=None, **kw) -> Endpoints:
    return Endpoints(given, resolver=resolver or (lambda e: [e]), clock=clock or Clock(), **kw)


def test_equal_endpoints_take_requests_in_turn():
    endpoints = pool(A, B, C)
    assert [endpoints.choose() for _ in range(6)] == [A, B, C, A, B, C]


def test_the_endpoint_with_fewest_outstanding_requests_is_chosen():
    endpoints = pool(A, B, C)
    for endpoint in (A, A, B, C):
        endpoints.sent(endpoint)
    assert endpoints.choose() in (B, C)
    endpoints.sent(B)
    assert endpoints.choose() == C


def test_a_retry_goes_to_an_endpoint_this_call_has_not_tried():
    endpoints = pool(A, B)
    assert endpoints.choose(tried=[A]) == B
    assert endpoints.choose(tried=[B]) == A


def test_a_set_aside_endpoint_gets_no_requests_while_others_answer():
    endpoints = pool(A, B, C)
    endpoints.set_aside(B)
    assert B not in {endpoints.choose() for _ in range(10)}


def test_when_every_other_endpoint_was_tried_a_set_aside_one_is_tried_again():
    endpoints = pool(A, B)
    endpoints.set_aside(B)
    assert endpoints.choose(tried=[A]) == B


def test_a_set_aside_endpoint_comes_back_only_once_it_answered_and_its_time_is_over():
    clock = Clock()
    endpoints = pool(A, B, clock=clock)
    endpoints.set_aside(B)
    clock.now += ASIDE_S
    assert endpoints.take_back() == []  # its time is over, but it has not answered
    endpoints.answered(B)
    assert endpoints.take_back() == [B]
    assert {endpoints.choose() for _ in range(4)} == {A, B}


def seconds_aside(endpoints: Endpoints, clock: Clock, endpoint: str) -> float:
    """How long a set-aside endpoint that answers its probe at once stays aside."""
    endpoints.answered(endpoint)
    began = clock.now
    while endpoint not in endpoints.take_back():
        clock.now += ASIDE_S / 4
    return clock.now - began


def test_an_endpoint_that_answers_at_once_still_stays_aside_its_least_time():
    clock = Clock()
    endpoints = pool(A, B, clock=clock)
    endpoints.set_aside(B)
    assert seconds_aside(endpoints, clock, B) == ASIDE_S


def test_an_endpoint_that_fails_again_when_taken_back_stays_aside_twice_as_long():
    clock = Clock()
    endpoints = pool(A, B, clock=clock)
    endpoints.set_aside(B)
    seconds_aside(endpoints, clock, B)
    endpoints.set_aside(B)
    assert seconds_aside(endpoints, clock, B) == 2 * ASIDE_S


def test_a_reply_resets_how_long_the_next_setting_aside_lasts():
    clock = Clock()
    endpoints = pool(A, B, clock=clock)
    endpoints.set_aside(B)
    endpoints.succeeded(B)  # a request in flight when it was set aside was answered
    endpoints.set_aside(B)
    assert seconds_aside(endpoints, clock, B) == ASIDE_S


def test_a_host_name_stands_for_every_address_it_resolves_to():
    endpoints = pool(NAMED, resolver=lambda e: [A, B, C])
    assert list(endpoints.addresses) == [A, B, C]


def test_a_host_name_is_looked_up_again_after_resolve_every():
    clock, answers = Clock(), [[A, B], [B, C]]
    endpoints = pool(NAMED, resolver=lambda e: answers.pop(0), clock=clock, resolve_every=10)
    assert not endpoints.resolve_due()
    clock.now += 10
    assert endpoints.resolve_due()
    gone = endpoints.update(endpoints.lookup())
    assert (gone, list(endpoints.addresses)) == ([A], [B, C])


def test_a_host_name_is_looked_up_again_soon_after_one_of_its_addresses_is_set_aside():
    clock = Clock()
    endpoints = pool(NAMED, resolver=lambda e: [A, B], clock=clock, resolve_every=10)
    endpoints.set_aside(A)
    clock.now += 1
    assert endpoints.resolve_due()


def test_a_name_that_stops_resolving_keeps_the_addresses_it_had():
    clock, answers = Clock(), [[A, B]]

    def resolver(endpoint):
        if not answers:
            raise OSError("Temporary failure in name resolution")
        return answers.pop(0)

    endpoints = pool(NAMED, resolver=resolver, clock=clock)
    clock.now += 60
    endpoints.update(endpoints.lookup())
    assert list(endpoints.addresses) == [A, B]


def test_a_name_that_never_resolved_stays_itself_for_the_connection_to_report():
    def resolver(endpoint):
        raise OSError("Name or service not known")

    assert list(pool(NAMED, resolver=resolver).addresses) == [NAMED]


def test_addresses_keep_what_is_known_of_them_across_lookups():
    clock, answers = Clock(), [[A, B], [A, B, C]]
    endpoints = pool(NAMED, resolver=lambda e: answers.pop(0), clock=clock)
    endpoints.set_aside(A)
    clock.now += 60
    endpoints.update(endpoints.lookup())
    assert endpoints.aside() == [A]


@pytest.mark.parametrize(
    "endpoint, named",
    [
        (
            "tcp://numaserve-zmq.prod.svc.cluster.local:5555",
            ("numaserve-zmq.prod.svc.cluster.local", 5555),
        ),
        ("tcp://localhost:5555", ("localhost", 5555)),
        ("tcp://10.1.2.3:5555", None),
        ("tcp://[::1]:5555", None),
        ("ipc:///run/numaserve/zmq.sock", None),
        ("tcp://eth0;server:5555", None),
    ],
)
def test_which_endpoints_are_host_names_to_look_up(endpoint, named):
    assert tcp_host(endpoint) == named


def test_a_real_lookup_gives_every_address_as_an_endpoint():
    assert "tcp://127.0.0.1:5555" in resolve("tcp://localhost:5555")


@pytest.fixture
def routers(tmp_path):
    running = []

    def start(endpoint=None) -> InProcessRouter:
        directory = tmp_path / f"r{len(running)}"
        directory.mkdir()
        router = InProcessRouter(directory, endpoint=endpoint)
        running.append(router)
        return router

    yield start
    for router in running:
        if router.thread.is_alive():
            router.close()


def served(router: InProcessRouter) -> int:
    return sum(w.inputs for w in router.workers)


def test_a_client_spreads_its_calls_over_every_server(routers):
    three = [routers() for _ in range(3)]
    with Client([r.endpoint for r in three], timeout=5) as client:
        for i in range(30):
            client.embed(f"text {i}")
    assert [served(r) for r in three] == [10, 10, 10]


def test_an_async_client_spreads_concurrent_calls_over_every_server(routers):
    three = [routers() for _ in range(3)]

    async def calls():
        async with AsyncClient([r.endpoint for r in three], timeout=5) as client:
            await asyncio.gather(*(client.embed(f"text {i}") for i in range(60)))

    asyncio.run(calls())
    counts = [served(r) for r in three]
    assert sum(counts) == 60 and min(counts) >= 16, counts


def test_a_server_that_stops_is_set_aside_and_taken_back_when_it_answers_again(routers):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    steady, leaving = routers(), routers(endpoint)
    with Client([steady.endpoint, endpoint], timeout=0.5, retries=2) as client:
        leaving.close()
        for i in range(10):  # one try times out on it; then it is aside and costs nothing
            client.embed(f"while it is gone {i}")
        assert client.pool.aside() == [endpoint]
        back = routers(endpoint)
        deadline = time.monotonic() + 5
        while served(back) == 0:
            assert time.monotonic() < deadline, "the server that came back got no calls"
            client.embed("after it came back")
            time.sleep(0.05)
        assert client.pool.aside() == []


def test_an_async_client_sets_a_stopped_server_aside_and_keeps_answering(routers):
    steady, leaving = routers(), routers()
    leaving.close()

    async def calls():
        endpoints = [steady.endpoint, leaving.endpoint]
        async with AsyncClient(endpoints, timeout=0.5, retries=2) as client:
            await asyncio.gather(*(client.embed(f"text {i}") for i in range(20)))
            return client.pool.aside()

    assert asyncio.run(calls()) == [leaving.endpoint]
    assert served(steady) == 20
