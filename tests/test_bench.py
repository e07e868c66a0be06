"""The load generator's arithmetic, inputs and HTTP target (the numaserve runs are in
test_router.py)."""

import json
import random

import pytest
from click.testing import CliRunner

from numaserve.cli import main
from numaserve.loadgen.bench import (
    CorpusError,
    Result,
    closed_loop,
    drawing,
    format_result,
    http_target,
    load_corpus,
    with_words_shuffled,
)
from numaserve.testing.ports import free_port
from tests.harness.stand_in import InProcessRouter


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


@pytest.fixture
def http_server():
    """A real HTTP server on loopback: 200 with the body echoed, 503 for texts saying "busy"
    (the text is the body's "text", TEI's "inputs" or OpenAI's "input"), at a peer's path and
    at numaserve's own /embed."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a load generator expects

        def do_POST(self):
            received = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = received.get("text") or received.get("inputs") or received["input"]
            busy = {"error": "the model is busy", "error_type": "Overloaded"}  # TEI's shape
            body = json.dumps(busy if "busy" in text else received).encode()
            self.send_response(503 if "busy" in text else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/embed"
    server.shutdown()
    server.server_close()


def test_closed_loop_drives_an_http_server(http_server):
    result = closed_loop(http_target(http_server), ["one text", "another"], 3, 4)
    summary = result.summary()
    assert summary["ok"] == summary["requests"] == 12 and summary["errors"] == {}


def test_the_http_body_is_the_routes_own(http_server):
    peer = http_server.replace("/embed", "/predictions/model")
    bodies = {}
    for url in (http_server, http_server.replace("/embed", "/v1/embeddings"), peer):
        with http_target(url, model="m")() as send:
            bodies[url.rsplit("/", 1)[1]] = json.loads(send("a text"))
    assert bodies == {
        "embed": {"inputs": "a text", "model": "m"},
        "embeddings": {"input": "a text", "model": "m"},
        "model": {"text": "a text"},
    }


def test_http_error_statuses_are_counted_by_code(http_server):
    result = closed_loop(http_target(http_server), ["busy text"], 2, 3)
    assert result.errors == {"http_503": 6} and result.latencies == []


def test_the_result_shows_what_the_server_said_for_each_error_code(http_server):
    summary = closed_loop(http_target(http_server), ["busy text"], 1, 2).summary()
    assert summary["error_messages"] == {"http_503": "the model is busy"}
    assert "  http_503: the model is busy" in format_result(summary)


@pytest.fixture
def router(tmp_path):
    made = InProcessRouter(tmp_path)  # the real router, stand-in workers doing embed
    yield made
    made.close()


def test_a_bench_where_every_request_fails_exits_1_with_the_servers_reason(router):
    command = ["bench", "--endpoint", router.endpoint, "--op", "classify"]
    out = CliRunner().invoke(main, [*command, "--clients", "1", "--requests", "3"])
    assert out.exit_code == 1, out.output
    assert "bad_request: 3" in out.output
    assert "every request failed (bad_request: " in out.output
    assert "does embed, not classify" in out.output


def test_a_bench_says_when_its_results_came_from_the_cache(router, tmp_path):
    corpus = tmp_path / "one.txt"
    corpus.write_text("the only text, asked again and again\n")
    command = ["bench", "--endpoint", router.endpoint, "--corpus", str(corpus)]
    out = CliRunner().invoke(main, [*command, "--clients", "1", "--requests", "5"])
    assert out.exit_code == 0, out.output
    assert "4 of 5 texts were answered from the router's cache" in out.output
    assert "server.cache_entries: 0" in out.output  # the key the config takes


def test_a_bench_names_the_server_that_answered_and_its_model(router):
    command = ["bench", "--endpoint", router.endpoint, "--clients", "1", "--requests", "2"]
    out = CliRunner().invoke(main, command)
    assert out.exit_code == 0, out.output
    assert f"server      {router.endpoint}: " in out.output
    assert "(embed)" in out.output.split(router.endpoint)[1].splitlines()[0]


def test_a_second_bench_of_the_built_in_corpus_is_not_answered_from_the_cache(router):
    command = ["bench", "--endpoint", router.endpoint, "--clients", "1", "--requests", "300"]
    first = CliRunner().invoke(main, [*command, "--json"])
    again = CliRunner().invoke(main, [*command, "--json"])
    assert first.exit_code == again.exit_code == 0, again.output
    assert json.loads(again.output)["cache"]["hits"] <= 15  # of 300: short sentences may recur
    assert "words shuffled per request" in json.loads(again.output)["texts"]


def test_shuffled_texts_keep_their_words_and_their_requests_shape():
    rng, texts = random.Random(1), ["one two three four five six", "seven eight nine ten"]
    for draw in (drawing("embed"), drawing("classify", pairs=True), drawing("rerank", documents=3)):
        plain, shuffled = draw(rng, texts), with_words_shuffled(draw)(random.Random(1), texts)
        assert [type(a) for a in shuffled] == [type(a) for a in plain]
        flat = [t for a in shuffled for t in ([a] if isinstance(a, str) else a)]
        assert all(sorted(t.split()) in [sorted(x.split()) for x in texts] for t in flat)


def test_an_http_server_that_is_not_there_counts_connection_errors():
    port = free_port()  # nobody listens on it
    result = closed_loop(http_target(f"http://127.0.0.1:{port}/"), ["text"], 1, 2)
    assert result.errors == {"connection": 2}


def test_http_target_posts_the_body_a_peer_wants(http_server):
    with http_target(http_server, body=lambda text: {"input": [text]})() as send:
        assert json.loads(send("one text")) == {"input": ["one text"]}


def test_http_target_wants_an_http_url():
    with pytest.raises(ValueError, match="not an http:// URL"):
        http_target("tcp://127.0.0.1:5555")


def test_bench_refuses_an_open_loop_over_http():
    out = CliRunner().invoke(main, ["bench", "--http", "http://127.0.0.1:1/", "--rate", "5"])
    assert out.exit_code == 2 and "closed loop only" in out.output


def test_default_corpus_does_not_depend_on_what_the_caller_imported(monkeypatch):
    import logging

    from numaserve import corpus

    def patched(self):
        """This sentence was patched into the stdlib by a test."""

    monkeypatch.setattr(logging.Logger, "patched_in", patched, raising=False)
    corpus._read_in_fresh_interpreter.cache_clear()
    assert "This sentence was patched into the stdlib by a test." not in load_corpus(None)


@pytest.mark.parametrize(
    "loop", [["--clients", "2", "--requests", "10"], ["--rate", "40", "--duration", "0.5"]]
)
def test_a_bench_over_two_servers_spreads_and_counts_the_replies_of_each(router, tmp_path, loop):
    (tmp_path / "other").mkdir()
    other = InProcessRouter(tmp_path / "other")
    try:
        command = ["bench", "--endpoint", router.endpoint, "--endpoint", other.endpoint, "--json"]
        out = CliRunner().invoke(main, [*command, *loop])
        assert out.exit_code == 0, out.output
        servers = json.loads(out.output)["servers"]
        assert set(servers) == {router.endpoint, other.endpoint}
        assert sum(servers.values()) == 20
        assert min(servers.values()) >= 8, servers
    finally:
        other.close()


@pytest.mark.parametrize("path", ["/embed", "/embed_sparse", "/embed_all", "/predict", "/ner"])
def test_bench_over_http_sends_teis_body_to_each_of_its_text_routes(path):
    from numaserve.loadgen.bench import body_for

    assert body_for(path)("a text") == {"inputs": "a text"}
    assert body_for(path, "m")("a text") == {"inputs": "a text", "model": "m"}
