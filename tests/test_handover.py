"""Which peer shard a request goes to when its own shard has no instance for it
(router/handover.py). The peers are read from the supervisor's slot table; shard 0 is ours,
1 and 2 its peers, and 3 a shard of another model."""

import pytest
import zmq

from numaserve.router.handover import Handover, is_handed_over
from numaserve.status.report import SlotTable, SupervisorInfo
from tests.harness.reports import slot


@pytest.fixture
def handover(tmp_path):
    endpoints = (*(f"ipc://{tmp_path}/handover-{i}.sock" for i in range(3)), "")
    h = Handover(zmq.Context.instance(), 0, endpoints, timeout=30)
    yield h
    h.close()


def table(*shards: dict, stopping=(), starting=()) -> SlotTable:
    """The supervisor's table: each shard's ready instances by pool, as slots."""
    slots, routers = [], []
    for shard in shards:
        number = shard.pop("shard")
        state = "draining" if number in stopping else "starting" if number in starting else "ready"
        routers.append((number, state))
        for pool, n in shard.items():
            slots += [slot(f"{pool}-{i}", shard=number, pool=pool) for i in range(n)]
            slots.append(slot(f"{pool}-{n}", shard=number, pool=pool, state="backoff"))
    return SlotTable(SupervisorInfo(pid=1), tuple(slots), tuple(routers))


def test_a_peer_with_a_ready_instance_of_every_pool_needed_is_chosen(handover):
    peers = table({"shard": 1, "small": 2, "large": 0}, {"shard": 2, "small": 1, "large": 1})
    assert handover.peer_for({"small", "large"}, peers) == 2


def test_the_peer_with_the_most_ready_instances_is_preferred(handover):
    assert (
        handover.peer_for({"small"}, table({"shard": 1, "small": 1}, {"shard": 2, "small": 3})) == 2
    )


def test_no_peer_has_one_and_none_is_chosen(handover):
    peers = table({"shard": 1, "small": 0}, {"shard": 2, "large": 4})
    assert handover.peer_for({"small"}, peers) is None
    assert handover.peer_for({"small"}, table()) is None
    assert handover.peer_for({"small"}, None) is None  # no slot table yet


def test_a_draining_or_starting_peer_is_never_chosen(handover):
    assert handover.peer_for({"small"}, table({"shard": 1, "small": 4}, stopping={1})) is None
    assert handover.peer_for({"small"}, table({"shard": 1, "small": 4}, starting={1})) is None


def test_the_ready_instances_at_peers_count_only_ready_peers_of_our_model(handover):
    """What a shard adds to its own for `ping` (the HTTP /health)."""
    peers = table(
        {"shard": 0, "small": 5},  # ours: counted by the shard itself
        {"shard": 1, "small": 2, "large": 1},
        {"shard": 2, "small": 4},
        {"shard": 3, "small": 8},  # another model's
        stopping={2},
    )
    assert handover.ready_at_peers(peers) == 3
    assert handover.ready_at_peers(None) == 0


def test_a_shard_of_another_model_is_never_chosen(handover):
    peers = table({"shard": 3, "small": 8}, {"shard": 1, "small": 1})
    assert handover.peer_for({"small"}, peers) == 1
    assert handover.peer_for({"small"}, table({"shard": 3, "small": 8})) is None


def test_only_a_peer_shard_s_own_connection_marks_a_request_handed_over():
    assert is_handed_over([b"handover/0"])
    assert not is_handed_over([b"\x00\x80\x00\x00\x29"])  # a client's id, from libzmq
    assert not is_handed_over([b"\x00\x80\x00\x00\x29", b"handover/0"])  # via the frontend
