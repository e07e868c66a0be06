"""`numaserve embed`, `classify`, `ner`, `rerank` and `status` as a user types them: the
real console script, against the real router in a thread (stand-in workers that embed), or
against nothing at all."""

import json
import time

import pytest

from numaserve.testing.ports import free_port
from tests.harness.console import numaserve
from tests.harness.stand_in import InProcessRouter


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    made = InProcessRouter(tmp_path_factory.mktemp("router"))
    yield made
    made.close()


def tokens_of(out) -> list[int]:
    assert out.returncode == 0, out.stderr
    return [r["tokens"] for r in json.loads(out.stdout)["results"]]


@pytest.mark.parametrize("command", ["status", "embed", "classify"])
def test_with_no_server_a_command_says_nothing_is_answering_within_seconds(command):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    texts = [] if command == "status" else ["hello"]
    start = time.monotonic()
    out = numaserve(command, *texts, "--endpoint", endpoint)
    assert time.monotonic() - start < 10  # a process start, then about 2 s; not 21 s
    assert out.returncode == 1
    assert f"nothing is answering at {endpoint}" in out.stderr
    assert "curve" not in out.stderr.lower() and "no reply to status" not in out.stderr
    assert "numaserve start" in out.stderr  # what to do about it


def test_embed_prints_one_line_of_json_per_text_not_one_per_number(router):
    out = numaserve("embed", "one text", "another text", "--endpoint", router.endpoint)
    assert len(out.stdout.splitlines()) == 4  # {"results": [, two results, ]}
    assert len(json.loads(out.stdout)["results"]) == 2


def test_embed_takes_json_as_every_command_does(router):
    out = numaserve("embed", "a text", "--json", "--endpoint", router.endpoint)
    assert len(tokens_of(out)) == 1


def test_a_dash_reads_one_text_from_standard_input(router):
    long_text = "word " * 200_000  # 1 MB: "Argument list too long" as an argument
    out = numaserve("embed", "-", "--endpoint", router.endpoint, stdin=long_text)
    assert len(tokens_of(out)) == 1
    assert json.loads(out.stdout)["results"][0]["truncated"]  # the text, not "-"


def test_file_reads_one_text_per_line_and_dash_is_standard_input(router, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("first line\n\nsecond line\nthird line\n")
    assert len(tokens_of(numaserve("embed", "--file", texts, "--endpoint", router.endpoint))) == 3
    piped = numaserve("embed", "--file", "-", "--endpoint", router.endpoint, stdin="a\nb\n")
    assert len(tokens_of(piped)) == 2


def test_no_text_at_all_is_a_usage_error_naming_the_ways_to_give_one(router):
    out = numaserve("embed", "--endpoint", router.endpoint)
    assert out.returncode == 2 and "--file" in out.stderr and "'-'" in out.stderr


def test_a_missing_file_is_a_usage_error(router, tmp_path):
    out = numaserve("embed", "--file", tmp_path / "nope.txt", "--endpoint", router.endpoint)
    assert out.returncode == 2 and "nope.txt" in out.stderr


def test_numaserve_endpoint_in_the_environment_is_the_default_endpoint(router):
    out = numaserve("embed", "from the environment", env={"NUMASERVE_ENDPOINT": router.endpoint})
    assert len(tokens_of(out)) == 1
    status = numaserve("status", "--json", env={"NUMASERVE_ENDPOINT": router.endpoint})
    assert status.returncode == 0 and "pools" in json.loads(status.stdout)


def test_a_text_over_the_servers_size_limit_is_refused_with_both_sizes(router):
    out = numaserve("embed", "-", "--endpoint", router.endpoint, stdin="x" * (17 << 20))
    assert out.returncode == 1
    assert "too_large" in out.stderr and "16,777,216" in out.stderr


def test_embed_file_longer_than_the_servers_max_texts_is_answered_whole(router, tmp_path):
    lines = tmp_path / "texts.txt"
    lines.write_text("".join(f"line {i} of the file\n" for i in range(2500)))  # max_texts: 2048
    out = numaserve("embed", "--file", str(lines), "--endpoint", router.endpoint)
    assert len(tokens_of(out)) == 2500
