"""`ner`: a token classifier's entities, with label, score and character span in the original
text, the same as transformers' token-classification pipeline gives for every aggregation
strategy; served through a real router, workers, client and CLI. Tiny random models made here
(tests/harness/checkpoints.py): random weights label tokens every which way, which exercises
every grouping rule."""

import asyncio
import json
import warnings

import pytest

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.client import AsyncClient, Entities, Entity
from numaserve.config.schema import ModelConfig
from numaserve.tasks.entities import entities
from numaserve.tasks.ner import AGGREGATIONS
from numaserve.tasks.requests import RequestError, parse_request
from numaserve.testing.cluster import Cluster
from tests.harness.checkpoints import (
    architectures,
    save_byte_level_bpe_tokenizer,
    save_tiny_model,
)
from tests.harness.console import numaserve

# Outputs judged against reference libraries, nothing timed: CI runs the slow ones on two
# workers (.ci/run).
pytestmark = pytest.mark.outputs_only
TEXTS = [
    "Ada Lovelace lived in London with Charles Babbage.",
    "unaffable John's e-mail: x@y.org, 1234 [MASK] café naïve",  # subwords, [UNK], accents
    "Paris",
]
STRATEGIES = AGGREGATIONS


def pipeline_entities(path, text: str, strategy: str) -> list[tuple]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import pipeline

        found = pipeline("token-classification", model=str(path), device="cpu")(
            text, aggregation_strategy=strategy
        )
    key = "entity" if strategy == "none" else "entity_group"
    return [(e[key], e["start"], e["end"], float(e["score"])) for e in found]


def ours(path, backend="torch", quantize="none") -> dict:
    """{(text, strategy): entities} from numaserve's model and the router's entity code."""
    config = ModelConfig(
        path=str(path), task="ner", backend=backend, quantize=quantize, max_length=64
    )
    tokenizer, model = Tokenizer(config.path, 64), load_model(config)
    out = {}
    for text in TEXTS:
        (encoded,) = tokenizer.encode_tagged([text])
        (rows,) = model.run([list(encoded.ids)])
        for strategy in STRATEGIES:
            found = entities(
                text, encoded.tokens, rows, model.labels, strategy, tokenizer.word_aware
            )
            out[text, strategy] = found
    return out


def assert_same(found: list[dict], expected: list[tuple], text: str) -> None:
    assert [(e["label"], e["start"], e["end"]) for e in found] == [e[:3] for e in expected]
    for entity, (_, start, end, score) in zip(found, expected, strict=True):
        assert entity["score"] == pytest.approx(score, abs=1e-4)
        assert entity["text"] == text[start:end]


@pytest.mark.parametrize("architecture", list(architectures()))
def test_entities_match_the_transformers_pipeline_for_every_strategy(tmp_path, architecture):
    path = save_tiny_model(tmp_path / "m", architecture, "ner")
    found = ours(path)
    assert any(found.values())  # random weights: entities of some kind in every run
    for (text, strategy), entities_ in found.items():
        assert_same(entities_, pipeline_entities(path, text, strategy), text)


def test_a_tokenizer_that_does_not_mark_subwords_gets_the_pipelines_heuristic(tmp_path):
    """RoBERTa's byte-level BPE: a token is part of the word before it when no space is
    next to its start, as the pipeline guesses (with a warning) for first, average and max."""
    path = save_byte_level_bpe_tokenizer(save_tiny_model(tmp_path / "m", "roberta", "ner"))
    assert not Tokenizer(str(path), 64).word_aware
    for (text, strategy), entities_ in ours(path).items():
        assert_same(entities_, pipeline_entities(path, text, strategy), text)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["bert", "distilbert", "roberta"])
def test_onnx_entities_match_the_transformers_pipeline(tmp_path, architecture):
    path = save_tiny_model(tmp_path / "m", architecture, "ner")
    for (text, strategy), entities_ in ours(path, "onnxruntime").items():
        assert_same(entities_, pipeline_entities(path, text, strategy), text)


def test_aggregation_none_answers_each_token_with_its_index(tmp_path):
    path = save_tiny_model(tmp_path / "m", "bert", "ner")
    tokens = [e for e in ours(path)[TEXTS[0], "none"]]
    assert tokens and all(isinstance(e["index"], int) for e in tokens)
    assert all("-" in e["label"] or e["label"] == "MISC" for e in tokens)  # B-/I- kept


@pytest.mark.parametrize(
    "body, message",
    [
        ({"op": "ner", "texts": ["a"], "aggregation": "longest"}, "aggregation must be one of"),
        ({"op": "embed", "texts": ["a"], "aggregation": "simple"}, "aggregation is for ner"),
    ],
)
def test_a_wrong_aggregation_is_a_bad_request(body, message):
    with pytest.raises(RequestError, match=message):
        parse_request({"id": 1, **body}, max_texts=8)


# -- through a real router, workers, client and CLI -------------------------------------------


@pytest.fixture(scope="module")
def ner_server(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("ner") / "ner", "bert", "ner")
    config = f"""
model: {{path: {path}, task: ner, backend: torch, quantize: none, max_length: 32}}
placement: {{pools: [{{name: short, max_tokens: 32, instances: 1}}]}}
"""
    running = Cluster(tmp_path_factory.mktemp("ner-server"), config).start()
    yield running, path
    running.stop()


def test_a_server_answers_the_pipelines_entities(ner_server):
    server, path = ner_server
    with server.client() as client:
        for strategy in STRATEGIES:
            results = client.ner(TEXTS, aggregation=strategy)
            for text, result in zip(TEXTS, results, strict=True):
                expected = pipeline_entities(path, text, strategy)
                assert_same([vars(e) for e in result.entities], expected, text)


def test_a_long_text_is_cut_and_its_entities_stay_in_the_text(ner_server):
    server, _ = ner_server
    text = "Ada Lovelace lived in London. " * 40
    with server.client() as client:
        result = client.ner(text, aggregation="none")
    assert result.truncated and result.tokens == 32
    assert all(0 <= e.start < e.end <= len(text) for e in result.entities)
    assert max(e.index for e in result.entities) <= 30  # within the kept tokens


def test_the_async_client_finds_entities_too(ner_server):
    server, _ = ner_server

    async def go():
        async with AsyncClient(server.endpoint) as client:
            return await client.ner(TEXTS[0])

    found = asyncio.run(go())
    assert isinstance(found, Entities) and all(isinstance(e, Entity) for e in found.entities)


def test_the_cli_and_bench_drive_ner(ner_server):
    server, _ = ner_server
    out = numaserve("ner", TEXTS[0], "--aggregation", "first", "--endpoint", server.endpoint)
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)["results"]
    assert all(set(e) == {"label", "score", "start", "end", "text"} for e in result["entities"])
    out = numaserve(
        *("bench", "--op", "ner", "--clients", "2", "--requests", "5", "--json"),
        *("--endpoint", server.endpoint),
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["errors"] == {}
