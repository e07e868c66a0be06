"""Which peer shard a request goes to when its own shard has no instance for it
(router/handover.py). The peers are the statuses the supervisor forwards; shard 0 is ours,
1 and 2 its peers, and 3 a shard of another model."""

import pytest
import zmq

from numaserve.router.handover import Handover, is_handed_over


@pytest.fixture
def handover(tmp_path):
    endpoints = (*(f"ipc://{tmp_path}/handover-{i}.sock" for i in range(3)), "")
    h = Handover(zmq.Context.instance(), 0, endpoints, timeout=30)
    yield h
    h.close()


def peer(shard: int, draining: bool = False, **ready: int) -> dict:
    pools = [{"name": name, "ready": n} for name, n in ready.items()]
    return {"shard": shard, "pools": pools, "draining": draining}


def test_a_peer_with_a_ready_instance_of_every_pool_needed_is_chosen(handover):
    peers = [peer(1, small=2, large=0), peer(2, small=1, large=1)]
    assert handover.peer_for({"small", "large"}, peers) == 2


def test_the_peer_with_the_most_ready_instances_is_preferred(handover):
    assert handover.peer_for({"small"}, [peer(1, small=1), peer(2, small=3)]) == 2


def test_no_peer_has_one_and_none_is_chosen(handover):
    assert handover.peer_for({"small"}, [peer(1, small=0), peer(2, large=4)]) is None
    assert handover.peer_for({"small"}, []) is None


def test_a_draining_peer_is_never_chosen(handover):
    assert handover.peer_for({"small"}, [peer(1, draining=True, small=4)]) is None


def test_a_shard_of_another_model_is_never_chosen(handover):
    assert handover.peer_for({"small"}, [peer(3, small=8), peer(1, small=1)]) == 1
    assert handover.peer_for({"small"}, [peer(3, small=8)]) is None


def test_only_a_peer_shard_s_own_connection_marks_a_request_handed_over():
    assert is_handed_over([b"handover/0"])
    assert not is_handed_over([b"\x00\x80\x00\x00\x29"])  # a client's id, from libzmq
    assert not is_handed_over([b"\x00\x80\x00\x00\x29", b"handover/0"])  # via the frontend
