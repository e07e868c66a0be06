"""The supervisor's slot table and a shard's answers: what liveness needs with every table (the
instances the shard routes to), its whole report only when the table asks, once a second. The
router is the real one (tests/harness/stand_in.py); the supervisor's side is on a FAKE OS
(tests/harness/fake_system.py)."""

import pytest
import zmq

from numaserve.client import Client
from numaserve.status.report import ServerReport, ShardReport
from numaserve.wire import protocol
from tests.harness.fake_system import Rig
from tests.harness.stand_in import InProcessRouter


@pytest.fixture
def router(tmp_path):
    r = InProcessRouter(tmp_path)
    yield r
    r.close()


def answer_to(router: InProcessRouter, report: bool) -> dict:
    sock = router.ctx.socket(zmq.DEALER)
    sock.connect(router.router.spec.workers_endpoint)
    table = {"type": protocol.SUPERVISOR, "seq": 7, "pid": 1, "slots": [], "routers": []}
    sock.send_multipart(protocol.pack(table | {"report": report}))
    try:
        assert sock.poll(5000), "the router did not answer the slot table"
        return protocol.unpack(sock.recv_multipart())
    finally:
        sock.close(linger=0)


def test_a_table_that_does_not_ask_is_answered_with_what_liveness_needs(router):
    answer = answer_to(router, report=False)
    assert set(answer) == {"type", "seq", "routed_pids"}  # no report
    assert (answer["type"], answer["seq"]) == (protocol.STATUS, 7)
    assert answer["routed_pids"] == list(router.router.own_status().routed_pids)


def test_a_table_that_asks_is_answered_with_the_whole_report_too(router):
    answer = answer_to(router, report=True)
    report = ShardReport.from_wire(answer["server"])
    assert list(report.routed_pids) == answer["routed_pids"]
    assert report.shard == 0 and report.metrics is not None


def test_the_supervisor_asks_for_the_whole_report_once_a_second(tmp_path):
    rig = Rig(tmp_path)
    rig.start()
    rig.router.tables.clear()
    rig.run_for(3.0)
    asks = [table["report"] for table in rig.router.tables]
    assert len(asks) >= 9  # a table every poll (0.25 s, on the loop's 0.1 s turns)
    assert 2 <= sum(asks) <= 3


def test_an_instance_is_judged_ready_from_the_answers_that_carry_no_report(tmp_path):
    rig = Rig(tmp_path)
    rig.router.quiet.add("main-1")  # still loading its model
    rig.sup.begin()
    rig.step()
    rig.step(seconds=0.3)  # no report asked since the first table
    assert rig.router.tables[-1]["report"] is False
    rig.router.quiet.clear()
    rig.step(seconds=0.3)
    rig.step()
    assert rig.states() == {"main-0": "ready", "main-1": "ready"}


def test_the_status_a_client_gets_is_the_reports_one_wire_form(router):
    """Read back as a ServerReport and written again, the answer is the same: no field is
    lost."""
    with Client(router.endpoint, timeout=5) as client:
        status = client.status()
    assert ServerReport.from_wire(status).to_wire() == status
    assert status["supervisor"] == {}  # no table yet: the shard answers alone
    assert [s["shard"] for s in status["shards"]] == [0] and "metrics" in status["shards"][0]
