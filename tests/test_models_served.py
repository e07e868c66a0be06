"""Several models served side by side by one server (`models:`): real `numaserve start`, real
clients on both models at once, live affinity from the kernel. Slow (each test starts
servers): CI runs them in their own step."""

import os
import threading

import numpy as np
import pytest

from numaserve.client import BadRequest, Client, NumaserveError
from tests.harness import server as server_
from tests.harness.console import numaserve

pytestmark = pytest.mark.slow

EMBED = """
  - {name: embed, path: "bundled:minilm", max_length: 128, backend: onnxruntime, quantize: int8,
      pools: [{name: main, max_tokens: 128, instances: 1}]}"""
TOXICITY = """
  - {name: toxicity, path: "@CLASSIFIER@", task: classify, max_length: 64, backend: onnxruntime, quantize: int8,
      pools: [{name: main, max_tokens: 64, instances: 1}]}"""
SERVER = """
server: {endpoint: "@ENDPOINT@", heartbeat_ms: 200, max_batch: 1}
"""

# Batch 1 in both, so that their answers can be compared bit for bit: under int8 a text's
# result depends on the texts batched with it (docs/configuration.md#micro-batching).
ONE_MODEL = """
model: {{path: "{path}", task: {task}, max_length: {length}, backend: onnxruntime, quantize: int8}}
server: {{endpoint: "@ENDPOINT@", heartbeat_ms: 200, max_batch: 1}}
placement: {{pools: [{{name: main, max_tokens: {length}, instances: 1}}]}}
"""
TEXTS = [f"text {i}: the quick brown fox jumps over {i} lazy dogs" for i in range(40)]


def two_models(classifier) -> str:
    return ("models:" + EMBED + TOXICITY + SERVER).replace("@CLASSIFIER@", str(classifier))


@pytest.fixture(scope="module")
def two(tmp_path_factory, classifier_dir):
    s = server_.Server(tmp_path_factory.mktemp("two"), two_models(classifier_dir))
    s.wait_ready()
    yield s
    s.stop()


def test_both_models_serve_under_concurrent_load_and_no_core_is_shared(two):
    outcomes: dict[str, list[str]] = {"embed": [], "toxicity": []}

    def load(model: str) -> None:
        with Client(two.endpoint, timeout=30, retries=0, model=model) as client:
            call = client.embed if model == "embed" else client.classify
            for text in TEXTS * 3:
                try:
                    call(text)
                    outcomes[model].append("ok")
                except NumaserveError as e:
                    outcomes[model].append(e.code)

    threads = [threading.Thread(target=load, args=(m,)) for m in ("embed", "toxicity") * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert outcomes == {"embed": ["ok"] * 240, "toxicity": ["ok"] * 240}
    instances = two.instances()
    assert {i["model_name"] for i in instances.values()} == {"embed", "toxicity"}
    live = [os.sched_getaffinity(i["pid"]) for i in instances.values()]
    assert all(live) and not set.intersection(*live)  # each on its own core, from the kernel
    assert all(i["affinity_ok"] for i in instances.values())


def test_each_models_answers_match_a_single_model_server(two, tmp_path, classifier_dir):
    with Client(two.endpoint, timeout=30, model="embed") as client:
        vectors = [e.vector for e in client.embed(TEXTS)]
    with Client(two.endpoint, timeout=30, model="toxicity") as client:
        classes = client.classify(TEXTS)

    for name, path, task, length in (
        ("embed", "bundled:minilm", "embed", 128),
        ("toxicity", classifier_dir, "classify", 64),
    ):
        text = ONE_MODEL.format(path=path, task=task, length=length)
        one = server_.Server(tmp_path, text, name=name)
        try:
            one.wait_ready()
            with Client(one.endpoint, timeout=30) as client:
                if task == "embed":
                    alone = [e.vector for e in client.embed(TEXTS)]
                    np.testing.assert_allclose(np.stack(vectors), np.stack(alone), atol=1e-6)
                else:
                    assert client.classify(TEXTS) == classes
        finally:
            one.stop()


def test_a_request_that_names_no_model_is_told_the_models_served(two):
    with Client(two.endpoint, timeout=30) as client, pytest.raises(BadRequest) as caught:
        client.embed("which model?")
    assert "this server serves several models (embed, toxicity)" in str(caught.value)


def test_the_cli_tells_a_command_that_names_no_model_to_name_one_with_its_flag(two):
    out = numaserve("embed", "which model?", "--endpoint", two.endpoint)
    assert out.returncode == 1
    assert "this server serves several models (embed, toxicity): name one with --model" in (
        out.stderr
    )


def test_status_shows_every_models_instances_and_pools(two):
    status = two.status()
    assert sorted(i["name"] for i in status["instances"]) == ["embed.main-0", "toxicity.main-0"]
    assert sorted((p["model_name"], p["name"], p["ready"]) for p in status["pools"]) == [
        ("embed", "main", 1),
        ("toxicity", "main", 1),
    ]


def test_a_reload_that_changes_one_model_keeps_the_others_instances_and_fails_nothing(two):
    """Last in this module: it changes the module's server."""
    before = {name: i["pid"] for name, i in two.instances().items()}
    text = "still served while the other model reloads"
    with (
        server_.calls_meanwhile(two.endpoint, "embed", "embed", text) as embeds,
        server_.calls_meanwhile(two.endpoint, "toxicity", "classify", text) as classes,
    ):
        two.config.write_text(
            two.config.read_text().replace(
                "task: classify, max_length: 64, backend: onnxruntime, quantize: int8",
                "task: classify, max_length: 64, backend: onnxruntime, quantize: none",
            )
        )
        two.reload_model("toxicity.main-0", before["toxicity.main-0"])
    outcomes = embeds + classes

    after = {name: i["pid"] for name, i in two.instances().items()}
    assert after["embed.main-0"] == before["embed.main-0"]  # untouched
    assert after["toxicity.main-0"] != before["toxicity.main-0"]
    assert outcomes and set(outcomes) == {"ok"}, sorted(set(outcomes))
    assert "unchanged, kept running: embed" in two.log()


def test_a_reload_that_removes_a_model_and_adds_another_fails_nothing_on_the_kept_one(
    tmp_path, classifier_dir
):
    """Two cores: the added model takes the removed one's, once it has stopped. The kept
    model serves throughout, from the same process."""
    s = server_.Server(tmp_path, two_models(classifier_dir))
    try:
        s.wait_ready()
        before = s.instances()
        text = "served while the other models come and go"
        with server_.calls_meanwhile(s.endpoint, "embed", "embed", text) as outcomes:
            s.config.write_text(s.config.read_text().replace("name: toxicity", "name: spam"))
            s.reload_logged()

        after = s.instances()
        assert sorted(after) == ["embed.main-0", "spam.main-0"]
        assert after["embed.main-0"]["pid"] == before["embed.main-0"]["pid"]
        assert outcomes and set(outcomes) == {"ok"}, sorted(set(outcomes))
        assert set(after["spam.main-0"]["cpus"]) == set(before["toxicity.main-0"]["cpus"])
        live = [os.sched_getaffinity(i["pid"]) for i in after.values()]
        assert all(live) and not set.intersection(*live)
        with Client(s.endpoint, timeout=30, model="spam") as client:
            assert client.classify(TEXTS[:2])
        with (
            Client(s.endpoint, timeout=30, model="toxicity") as client,
            pytest.raises(BadRequest, match="serves embed, spam"),
        ):
            client.classify("no longer served")
        assert "removing model(s) toxicity; adding model(s) spam" in s.log()
    finally:
        s.stop()


def test_one_reload_adds_a_model_on_the_free_core_and_rolls_the_changed_one_in_place(
    tmp_path, classifier_dir
):
    """Two cores, one model on the first: the reload adds the classifier, on the second, and
    changes the embedder, whose replacement takes its slot while it serves on."""
    s = server_.Server(tmp_path, "models:" + EMBED + SERVER)
    try:
        s.wait_ready()
        before = s.instances()
        assert sorted(before) == ["embed.main-0"]
        with server_.calls_meanwhile(s.endpoint, "embed", "embed", TEXTS[0]) as outcomes:
            toxicity = TOXICITY.replace("@CLASSIFIER@", str(classifier_dir))
            config = s.config.read_text().replace("\nserver:", toxicity + "\nserver:", 1)
            s.config.write_text(config.replace("name: embed,", "name: embed, padding: max_length,"))
            s.reload_logged()
            s.wait_replaced("embed.main-0", before["embed.main-0"]["pid"])

        after = s.instances()
        assert sorted(after) == ["embed.main-0", "toxicity.main-0"]
        assert outcomes and set(outcomes) == {"ok"}, sorted(set(outcomes))
        live = [os.sched_getaffinity(i["pid"]) for i in after.values()]
        assert all(live) and not set.intersection(*live)
        with Client(s.endpoint, timeout=30, model="toxicity") as client:
            assert client.classify(TEXTS[:2])
        assert "adding model(s) toxicity" in s.log()
    finally:
        s.stop()
