"""A repeated event is counted always, and logged at most once per interval with its count."""

import logging

from numaserve.processes.logs import Summary

log = logging.getLogger("numaserve.test-summary")


def test_a_repeated_event_logs_one_line_per_interval_with_the_counts(caplog):
    summary = Summary(log, "thing(s) happened", every=10.0)
    with caplog.at_level(logging.INFO, logger=log.name):
        summary.add(1, now=100.0)  # the first is logged at once
        for t in range(1, 10):
            summary.add(2, now=100.0 + t)  # within the interval: counted, not logged
        summary.flush(now=109.9)
        summary.flush(now=110.0)  # the interval is over: the rest, in one line
    assert [r.getMessage() for r in caplog.records] == [
        "1 thing(s) happened (1 in all)",
        "18 thing(s) happened (19 in all)",
    ]
    assert summary.total == 19


def test_a_summary_carries_the_latest_detail_and_its_level(caplog):
    summary = Summary(log, "failure(s)", every=10.0, level=logging.ERROR)
    with caplog.at_level(logging.INFO, logger=log.name):
        summary.add(1, now=0.0, detail="Traceback: the first\n")
        summary.add(1, now=1.0, detail="Traceback: the second\n")
        summary.flush(now=11.0)
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR]
    assert (
        caplog.records[1].getMessage()
        == "1 failure(s) (2 in all); the latest:\nTraceback: the second"
    )
