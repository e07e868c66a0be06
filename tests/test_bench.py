"""The load generator's arithmetic and inputs (the live runs are in test_router.py)."""

import pytest

from numaserve.bench import CorpusError, Result, format_result, load_corpus


def test_corpus_keeps_every_non_blank_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("first text\n\n  second text  \n")
    assert load_corpus(path) == ["first text", "second text"]


def test_default_corpus_is_real_sentences():
    assert len(load_corpus(None)) > 1000


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="cannot read corpus"):
        load_corpus(tmp_path / "nope.txt")


def test_empty_corpus_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("\n \n")
    with pytest.raises(CorpusError, match="no non-blank line"):
        load_corpus(path)


def test_summary_reports_throughput_percentiles_and_errors():
    result = Result("closed", "embed", seconds=2.0, latencies=[i / 1000 for i in range(1, 101)])
    result.record_error("overloaded")
    summary = result.summary()
    assert (summary["requests"], summary["ok"], summary["throughput_rps"]) == (101, 100, 50.0)
    assert summary["latency_ms"]["p50"] == 50.5
    assert (
        summary["latency_ms"]["p95"],
        summary["latency_ms"]["p99"],
        summary["latency_ms"]["max"],
    ) == (96.0, 100.0, 100.0)
    assert summary["errors"] == {"overloaded": 1}
    assert "p99 100.00" in format_result(summary)


def test_summary_of_a_run_where_everything_failed():
    result = Result("open", "embed", seconds=1.0)
    result.record_error("timeout")
    summary = result.summary()
    assert summary["latency_ms"]["p50"] is None and summary["throughput_rps"] == 0.0
    assert "p50 -" in format_result(summary)
