"""The supervisor answers `status` for the whole server, a shard's question as its control
socket's: the shards never forward their statuses to each other. On a FAKE OS (tests/harness/
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


def test_a_shard_asked_for_status_gets_the_whole_server_back_from_fresh_reports(tmp_path):
    rig = Rig(tmp_path, routers=2)
    rig.start()
    rig.shards[0].status = shard_status(0, requests=7)
    rig.shards[1].status = shard_status(1, requests=5)
    rig.shards[0].asking.append({"type": protocol.WHOLE, "token": 3})
    rig.step()  # the question: the supervisor asks every shard for its report
    assert rig.shards[0].wholes == [] and rig.shards[0].tables[-1]["report"]
    rig.step()  # their reports, and the answer
    (answer,) = rig.shards[0].wholes
    whole = answer["server"]
    assert answer["token"] == 3
    assert [s["shard"] for s in whole["shards"]] == [0, 1]
    assert whole["requests"] == {"requests": 12}
    assert whole["pools"][0]["queue"] == 2
    assert {i["name"] for i in whole["instances"]} == set(rig.states())
    assert (whole["supervisor"]["pid"], whole["supervisor"]["boot_id"]) == (1, "fake-boot")
    assert rig.shards[1].wholes == []


def test_a_shards_question_and_the_control_sockets_get_the_same_answer(tmp_path):
    rig = Rig(tmp_path, routers=2)
    rig.start()
    answers = []
    rig.sup.ask_status(Asker(answers), rig.os.now())
    rig.shards[1].asking.append({"type": protocol.WHOLE, "token": 0})
    rig.step()
    rig.step()
    ((control,), (shard,)) = answers, rig.shards[1].wholes
    assert shard["server"] == control["status"]


def test_a_flood_of_status_questions_costs_one_round_of_reports_and_answers_each(tmp_path):
    rig = Rig(tmp_path, routers=2)
    rig.start()
    sent = len(rig.shards[0].tables)
    rig.shards[0].asking += [{"type": protocol.WHOLE, "token": t} for t in range(100)]
    rig.step()  # the questions: one table asks for every shard's report
    assert len(rig.shards[0].tables) == sent + 1
    rig.step()
    assert [answer["token"] for answer in rig.shards[0].wholes] == list(range(100))


def test_a_question_no_report_can_answer_yet_gets_none_so_the_shard_answers_alone(tmp_path):
    rig = Rig(tmp_path, routers=2)
    for fake in rig.shards:
        fake.status = None  # they answer the tables, with no report
    rig.start()
    rig.shards[0].asking.append({"type": protocol.WHOLE, "token": 1})
    rig.step()
    rig.step()
    assert rig.shards[0].wholes == [{"type": protocol.WHOLE, "token": 1, "server": None}]


class Asker:
    """The control socket's side of a question: what `answer` is given."""

    def __init__(self, answers: list) -> None:
        self.answers = answers

    def answer(self, body: dict) -> None:
        self.answers.append(body)
