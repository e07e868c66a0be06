"""Where several router shards serve, the supervisor answers `status` for the whole server:
the shards never forward their statuses to each other. On a FAKE OS (tests/harness/
fake_system.py): the fake shards answer the supervisor as the real ones do (router/loop.py),
and tests/test_router_shards.py (slow) asks real shards."""

from numaserve.status.report import Cache
from numaserve.wire import protocol
from tests.harness.fake_system import Rig
from tests.harness.reports import pool, report


def shard_status(shard: int, requests: int):
    """What a shard reports, as router/status.py builds it."""
    return report(
        shard,
        pools=(pool("short", queue=1),),
        cache=Cache(entries=1, capacity=10, hits=2, misses=3, hit_rate=0.4),
        requests={"requests": requests},
    )


def test_every_shard_gets_the_same_slot_table_and_none_of_the_others_status(tmp_path):
    rig = Rig(tmp_path, routers=2)
    rig.start()
    first, second = rig.shards[0].tables[-1], rig.shards[1].tables[-1]
    assert first == second
    assert "peers" not in first
    assert first["routers"] == [{"shard": 0, "state": "ready"}, {"shard": 1, "state": "ready"}]


def test_a_shard_asked_for_status_gets_the_whole_server_back(tmp_path):
    rig = Rig(tmp_path, routers=2)
    rig.start()
    rig.shards[1].status = shard_status(1, requests=5)
    rig.step(seconds=1.1)  # the supervisor asks for shard 1's report (once a second)
    rig.step()  # and hears it
    own = shard_status(0, requests=7).to_wire()
    rig.shards[0].asking.append({"type": protocol.WHOLE, "token": 3, "server": own})
    rig.step()
    (answer,) = rig.shards[0].wholes
    whole = answer["server"]
    assert answer["token"] == 3
    assert [s["shard"] for s in whole["shards"]] == [0, 1]
    assert whole["requests"] == {"requests": 12}
    assert whole["pools"][0]["queue"] == 2
    assert rig.shards[1].wholes == []


def test_a_malformed_status_in_a_question_is_answered_with_itself(tmp_path):
    rig = Rig(tmp_path, routers=2)
    rig.start()
    rig.shards[0].asking.append({"type": protocol.WHOLE, "token": 1, "server": {"shard": 0}})
    rig.step()
    assert rig.shards[0].wholes == [{"type": protocol.WHOLE, "token": 1, "server": {"shard": 0}}]
