"""Sentence pairs (`classify` with [a, b]) and `rerank` (a cross-encoder's score for each
(query, document)): encoded as transformers encodes them, scored as transformers and
sentence-transformers score them, and served through a real router, workers, client and CLI.
Tiny random models made here (tests/harness/checkpoints.py)."""

import asyncio
import json
import warnings

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer, TooLongError
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import AsyncClient, BadRequest, Ranked
from numaserve.config.schema import ModelConfig
from numaserve.tasks.requests import Request, RequestError, parse_request
from numaserve.tasks.rerank import ranked
from numaserve.testing.cluster import Cluster
from numaserve.testing.windows import document
from numaserve.testing.windows import windows_by_hand as cut_by_hand
from numaserve.wire import protocol
from tests.harness.checkpoints import (
    LABELS,
    architectures,
    save_tiny_cross_encoder,
    save_tiny_model,
)
from tests.harness.console import numaserve

# Outputs judged against reference libraries, nothing timed: CI runs the slow ones on two
# workers (.ci/run).
pytestmark = pytest.mark.outputs_only
PAIRS = [
    ("what is a fox", "a fox is an animal of the dog family"),
    ("what is a fox", "the weather is nice today"),
    ("A man plays a guitar.", "Somebody is making music!"),
    ("q", "d"),
]
QUERY, DOCUMENTS = "where do foxes live", ["in forests", "foxes live in dens and forests", "x"]
# Segment embeddings (token type ids) in bert, albert and electra; none in the others.
ARCHITECTURES = list(architectures())


def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm"))


# -- tokenizing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pair",
    [
        PAIRS[0],
        ("short", "long " * 100),  # the longer text is cut
        ("long " * 100, "x"),
        ("a " * 40, "b " * 41),  # both cut, to the odd token
        ("word " * 3000, "other " * 2000),  # both cut before tokenizing (16 chars a token)
    ],
    ids=["fits", "second-cut", "first-cut", "both-cut", "both-huge"],
)
def test_a_pair_is_encoded_as_transformers_encodes_it(pair):
    (ours,) = Tokenizer("bundled:minilm", max_length=32).encode([pair])
    theirs = hf_tokenizer()(*pair, truncation=True, max_length=32)
    assert list(ours.ids) == theirs["input_ids"]
    assert ours.second == theirs["token_type_ids"].index(1)
    assert ours.truncated == (len(hf_tokenizer()(*pair)["input_ids"]) > 32)


def test_a_pair_too_long_is_refused_when_truncation_is_off():
    tok = Tokenizer("bundled:minilm", max_length=16, truncate=False)
    with pytest.raises(TooLongError, match="text 1 has 23 tokens; the limit is 16"):
        tok.encode(["fine", ("a b c d e f g h i j", "k l m n o p q r s t")])


def test_pairs_and_single_texts_mix_in_one_request():
    tok = Tokenizer("bundled:minilm", max_length=64)
    single, pair = tok.encode(["what is a fox", PAIRS[0]])
    assert single.second == 0 and list(single.ids) == hf_tokenizer()("what is a fox")["input_ids"]
    assert pair.second > 0


# -- the protocol ---------------------------------------------------------------------------


def parse(body: dict) -> Request:
    return parse_request({"id": 1, **body}, max_texts=64)


def bad_request(body: dict) -> str:
    with pytest.raises(RequestError) as e:
        parse(body)
    assert e.value.code is protocol.ErrorCode.BAD_REQUEST
    return e.value.message


def test_classify_takes_a_pair_as_a_list_of_two_texts():
    request = parse({"op": "classify", "texts": [["premise", "hypothesis"], "single"]})
    assert request.texts == (("premise", "hypothesis"), "single")
    assert request.inputs() == [("premise", "hypothesis"), "single"]


@pytest.mark.parametrize(
    "pair, message",
    [
        ([], "text 0 is a list of 0; a pair is a list of two texts"),
        (["a", "b", "c"], "text 0 is a list of 3; a pair is a list of two texts"),
        (["a", 3], "text 0[1] is not a string"),
        (["a", "  "], "text 0[1] is empty"),
    ],
)
def test_a_pair_that_is_not_two_texts_is_a_bad_request(pair, message):
    assert bad_request({"op": "classify", "texts": [pair]}) == message


def test_embed_takes_no_pairs():
    message = bad_request({"op": "embed", "texts": [["a", "b"]]})
    assert message == "text 0 is not a string; pairs [a, b] are for classify"


def test_rerank_scores_each_document_for_the_query():
    request = parse({"op": "rerank", "query": "q", "texts": ["d1", "d2"], "top_k": 1})
    assert request.inputs() == [("q", "d1"), ("q", "d2")] and request.options["top_k"] == 1


@pytest.mark.parametrize(
    "body, message",
    [
        ({"texts": ["d"]}, "query is not a string"),
        ({"query": " ", "texts": ["d"]}, "query is empty"),
        ({"query": "q"}, "rerank needs texts (documents): a string or a non-empty list of strings"),
        ({"query": "q", "texts": ["d"], "top_k": 0}, "top_k must be an integer of at least 1"),
        ({"query": "q", "texts": ["d"], "top_k": True}, "top_k must be an integer of at least 1"),
    ],
)
def test_a_rerank_request_without_what_it_needs_is_a_bad_request(body, message):
    assert bad_request({"op": "rerank", **body}) == message


def test_query_and_top_k_are_refused_outside_rerank_naming_the_keys_given():
    message = bad_request({"op": "classify", "texts": ["a"], "top_k": 3})
    assert message == "top_k is for rerank, not classify"
    message = bad_request({"op": "ner", "texts": ["a"], "query": "q", "top_k": 3})
    assert message == "query and top_k are for rerank, not ner"


def test_raw_scores_is_refused_where_there_are_no_logits_naming_the_tasks_that_have_them():
    message = bad_request({"op": "embed", "texts": ["a"], "raw_scores": True})
    assert message == "raw_scores is for classify and rerank, not embed"


def test_a_request_passed_on_keeps_its_pairs_query_and_top_k():
    request = parse({"op": "rerank", "query": "q", "texts": ["d"], "top_k": 2, "deadline_ms": 9})
    assert parse(request.to_body()) == request
    pairs = parse({"op": "classify", "texts": [["a", "b"]]})
    assert parse(pairs.to_body()) == pairs


def test_top_k_answers_the_best_first_and_ties_keep_their_order():
    results = [{"score": s} for s in (0.2, 0.9, 0.5, 0.9)]
    assert [r["index"] for r in ranked(results, None)] == [0, 1, 2, 3]
    assert [r["index"] for r in ranked(results, 3)] == [1, 3, 2]


# -- the model, against the references --------------------------------------------------------


def served(path, task: str, inputs, backend="torch", quantize="none", segments=True):
    config = ModelConfig(
        path=str(path), task=task, backend=backend, quantize=quantize, max_length=64
    )
    encoded = Tokenizer(config.path, config.max_length).encode(list(inputs))
    model = load_model(config)
    out = model.run(
        [list(e.ids) for e in encoded], [e.second for e in encoded] if segments else None
    )
    return np.array([r.probs for r in out] if task == "classify" else [r.score for r in out])


def transformers_pair_logits(path, pairs=PAIRS) -> np.ndarray:
    """transformers on each pair alone: token type ids where the model has segment
    embeddings (the MiniLM tokenizer makes them for every model)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    rows = []
    with torch.inference_mode():
        for a, b in pairs:
            inputs = hf_tokenizer()(a, b, return_tensors="pt")
            if getattr(model.config, "type_vocab_size", 0) < 2:
                inputs.pop("token_type_ids")
            rows.append(model(**inputs).logits[0].numpy())
    return np.stack(rows)


def transformers_pair_probs(path) -> np.ndarray:
    """Their softmax."""
    logits = transformers_pair_logits(path)
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def cross_encoder_scores(path, pairs) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import CrossEncoder

        return CrossEncoder(str(path), device="cpu").predict(pairs)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_pair_probabilities_match_transformers(tmp_path, architecture):
    path = save_tiny_model(tmp_path / "m", architecture, "classify")
    ours = served(path, "classify", PAIRS)
    np.testing.assert_allclose(ours, transformers_pair_probs(path), atol=1e-4)


def test_the_second_texts_token_types_change_the_answer(tmp_path):
    """Why the segments travel to the worker: without them a BERT pair model answers
    differently, by more than the tolerance the tests above hold it to."""
    path = save_tiny_model(tmp_path / "m", "bert", "classify")
    with_types, without = (
        served(path, "classify", PAIRS),
        served(path, "classify", PAIRS, segments=False),
    )
    assert np.abs(with_types - without).max() > 1e-3


def test_rerank_scores_match_cross_encoder_predict(tmp_path):
    path = save_tiny_cross_encoder(tmp_path / "ce")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    np.testing.assert_allclose(
        served(path, "rerank", pairs), cross_encoder_scores(path, pairs), atol=1e-4
    )


def test_a_cross_encoder_saved_with_identity_activation_gives_raw_logits(tmp_path):
    import torch

    path = save_tiny_cross_encoder(tmp_path / "ce", activation=torch.nn.Identity())
    pairs = [(QUERY, d) for d in DOCUMENTS]
    ours = served(path, "rerank", pairs)
    # The sigmoid of these logits (0.17-0.19) would be 0.54-0.55: far outside the tolerance.
    np.testing.assert_allclose(ours, cross_encoder_scores(path, pairs), atol=1e-4)


def test_the_heads_keep_the_models_logits_beside_their_scores(tmp_path):
    """What raw_scores answers: the classifier's logits before the softmax, the
    cross-encoder's before the sigmoid."""
    nli = save_tiny_model(tmp_path / "nli", "bert", "classify")
    config = ModelConfig(
        path=str(nli), task="classify", backend="torch", quantize="none", max_length=64
    )
    encoded = Tokenizer(config.path, 64).encode(list(PAIRS))
    out = load_model(config).run([list(e.ids) for e in encoded], [e.second for e in encoded])
    np.testing.assert_allclose([r.logits for r in out], transformers_pair_logits(nli), atol=1e-4)
    ce = save_tiny_cross_encoder(tmp_path / "ce")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    config = ModelConfig(
        path=str(ce), task="rerank", backend="torch", quantize="none", max_length=64
    )
    encoded = Tokenizer(config.path, 64).encode(pairs)
    out = load_model(config).run([list(e.ids) for e in encoded], [e.second for e in encoded])
    np.testing.assert_allclose(
        [r.logit for r in out], transformers_pair_logits(ce, pairs)[:, 0], atol=1e-4
    )
    assert all(abs(r.score - 1 / (1 + np.exp(-r.logit))) < 1e-6 for r in out)


def test_a_cross_encoder_with_an_activation_numaserve_lacks_is_refused(tmp_path):
    path = save_tiny_cross_encoder(tmp_path / "ce")
    settings = path / "config_sentence_transformers.json"
    saved = json.loads(settings.read_text())
    settings.write_text(json.dumps({**saved, "activation_fn": "torch.nn.modules.activation.Tanh"}))
    with pytest.raises(
        ModelLoadError, match="activation is Tanh; numaserve applies Sigmoid, Identity"
    ):
        served(path, "rerank", PAIRS)


def test_a_classifier_with_several_labels_is_no_reranker(tmp_path):
    path = save_tiny_model(tmp_path / "m", "bert", "classify")
    with pytest.raises(
        ModelLoadError, match=f"has {len(LABELS)} labels; a reranker .* task: classify"
    ):
        served(path, "rerank", PAIRS)


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_onnx_pair_probabilities_match_transformers(tmp_path, architecture, quantize):
    path = save_tiny_model(tmp_path / "m", architecture, "classify")
    ours = served(path, "classify", PAIRS, "onnxruntime", quantize)
    np.testing.assert_allclose(
        ours, transformers_pair_probs(path), atol=1e-4 if quantize == "none" else 2e-2
    )


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_onnx_rerank_scores_match_cross_encoder_predict(tmp_path, quantize):
    path = save_tiny_cross_encoder(tmp_path / "ce")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    ours = served(path, "rerank", pairs, "onnxruntime", quantize)
    theirs = cross_encoder_scores(path, pairs)
    np.testing.assert_allclose(ours, theirs, atol=1e-4 if quantize == "none" else 2e-2)
    if quantize == "none":  # int8 keeps the order (docs/accuracy.md measures real weights)
        assert list(np.argsort(ours)) == list(np.argsort(theirs))


# -- through a real router, workers, client and CLI -------------------------------------------


def cluster(tmp_path, path, task: str) -> Cluster:
    config = f"""
model: {{path: {path}, task: {task}, backend: torch, quantize: none, max_length: 64}}
placement: {{pools: [{{name: short, max_tokens: 16, instances: 1}},
                     {{name: long, max_tokens: 64, instances: 1}}]}}
"""
    return Cluster(tmp_path, config).start()


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory):
    path = save_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "ce")
    running = cluster(tmp_path_factory.mktemp("rerank"), path, "rerank")
    yield running, path
    running.stop()


@pytest.fixture(scope="module")
def pair_server(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("nli") / "nli", "bert", "classify")
    running = cluster(tmp_path_factory.mktemp("pairs"), path, "classify")
    yield running, path
    running.stop()


def test_a_server_classifies_pairs_as_transformers_does(pair_server):
    server, path = pair_server
    with server.client() as client:
        results = client.classify(PAIRS)
        single = client.classify(PAIRS[0])
    np.testing.assert_allclose([r.probs for r in results], transformers_pair_probs(path), atol=1e-4)
    assert single == results[0]
    assert results[0].tokens == len(hf_tokenizer()(*PAIRS[0])["input_ids"])


def test_a_server_answers_the_logits_only_where_asked_from_one_cached_result(pair_server):
    server, path = pair_server
    with server.client() as client:
        plain = client.classify(PAIRS)
        raw = client.classify(PAIRS, raw_scores=True)  # from the cache the first call filled
        again = client.classify(PAIRS[0])
    np.testing.assert_allclose([r.logits for r in raw], transformers_pair_logits(path), atol=1e-4)
    assert [r.probs for r in raw] == [r.probs for r in plain]
    assert all(r.logits is None for r in plain) and again.logits is None


def test_a_pair_and_the_same_tokens_as_one_text_are_cached_apart(pair_server):
    """'a [SEP] b' tokenizes to a pair's ids with no second segment: a different input."""
    server, _ = pair_server
    with server.client() as client:
        pair = client.classify(("a fox", "an animal"))
        joined = client.classify("a fox [SEP] an animal")
    assert pair.tokens == joined.tokens and pair.probs != joined.probs


def test_a_server_reranks_as_cross_encoder_predict_does(rerank_server):
    server, path = rerank_server
    with server.client() as client:
        in_order = client.rerank(QUERY, DOCUMENTS)
        best = client.rerank(QUERY, DOCUMENTS, top_k=2)
    theirs = cross_encoder_scores(path, [(QUERY, d) for d in DOCUMENTS])
    assert [r.index for r in in_order] == [0, 1, 2]
    np.testing.assert_allclose([r.score for r in in_order], theirs, atol=1e-4)
    assert [r.index for r in best] == list(np.argsort(-theirs)[:2])


def test_a_server_reranks_with_the_logits_where_asked(rerank_server):
    server, path = rerank_server
    pairs = [(QUERY, d) for d in DOCUMENTS]
    with server.client() as client:
        best = client.rerank(QUERY, DOCUMENTS, top_k=2, raw_scores=True)
        plain = client.rerank(QUERY, DOCUMENTS, top_k=2)
    logits = transformers_pair_logits(path, pairs)[:, 0]
    assert [r.index for r in best] == [r.index for r in plain] == list(np.argsort(-logits)[:2])
    np.testing.assert_allclose([r.logit for r in best], logits[[r.index for r in best]], atol=1e-4)
    assert [r.score for r in best] == [r.score for r in plain]
    assert all(r.logit is None for r in plain)


def test_the_async_client_reranks_too(rerank_server):
    server, _ = rerank_server

    async def go():
        async with AsyncClient(server.endpoint) as client:
            return await client.rerank(QUERY, DOCUMENTS, top_k=1, raw_scores=True)

    (best,) = asyncio.run(go())
    assert isinstance(best, Ranked) and best.index in range(len(DOCUMENTS))
    assert best.logit is not None


def test_a_long_document_goes_to_the_pool_its_pair_fits(rerank_server):
    server, _ = rerank_server
    long_document = "foxes " * 30
    with server.client() as client:
        before = {p["name"]: p for p in client.status()["pools"]}
        (result,) = client.rerank(QUERY, [long_document])
        served = {i["pool"]: i["served"] for i in client.status()["instances"]}
    assert result.tokens > 16 and served["long"] >= 1
    assert before  # the status op answers on a rerank server


LONG_DOCUMENT = document(150)


def windows_by_hand(max_length: int = 64) -> list[str]:
    return cut_by_hand(hf_tokenizer(), QUERY, LONG_DOCUMENT, max_length)


def test_a_document_longer_than_the_model_reads_scores_its_best_window(rerank_server):
    server, path = rerank_server
    windows = windows_by_hand()
    by_hand = cross_encoder_scores(path, [(QUERY, w) for w in windows])
    with server.client() as client:
        (chunked,) = client.rerank(QUERY, [LONG_DOCUMENT])
        (cut,) = client.rerank(QUERY, [LONG_DOCUMENT], max_chunks_per_doc=1)
        (two,) = client.rerank(QUERY, [LONG_DOCUMENT], max_chunks_per_doc=2)
    assert chunked.chunks == len(windows) > 2 and not chunked.truncated
    assert chunked.score == pytest.approx(float(by_hand.max()), abs=1e-4)
    assert cut.chunks == 1 and cut.truncated and cut.tokens == 64
    assert cut.score == pytest.approx(float(by_hand[0]), abs=1e-4)  # the head alone, as before
    assert two.chunks == 2 and two.truncated
    assert two.score == pytest.approx(float(by_hand[:2].max()), abs=1e-4)


def test_classify_on_a_rerank_server_is_a_bad_request(rerank_server):
    server, _ = rerank_server
    with server.client() as client, pytest.raises(BadRequest, match="does rerank, not classify"):
        client.classify("a text")


def test_the_cli_reranks_and_classifies_pairs(rerank_server, pair_server):
    out = numaserve(
        "rerank", QUERY, *DOCUMENTS, "--top-k", "1", "--endpoint", rerank_server[0].endpoint
    )
    assert out.returncode == 0, out.stderr
    (best,) = json.loads(out.stdout)["results"]
    assert set(best) == {"index", "score", "tokens", "truncated"}
    out = numaserve(
        "classify", "--pairs", *PAIRS[0], *PAIRS[1], "--endpoint", pair_server[0].endpoint
    )
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["results"]) == 2
    odd = numaserve("classify", "--pairs", "one", "--endpoint", pair_server[0].endpoint)
    assert odd.returncode == 2 and "--pairs needs an even number of texts; got 1" in odd.stderr


def test_the_cli_says_how_many_windows_a_long_document_was_scored_in(rerank_server):
    endpoint = rerank_server[0].endpoint
    windowed = numaserve("rerank", QUERY, LONG_DOCUMENT, "--endpoint", endpoint)
    cut = numaserve(
        "rerank", QUERY, LONG_DOCUMENT, "--max-chunks-per-doc", "1", "--endpoint", endpoint
    )
    assert windowed.returncode == 0 and cut.returncode == 0, windowed.stderr + cut.stderr
    (whole,) = json.loads(windowed.stdout)["results"]
    (head,) = json.loads(cut.stdout)["results"]
    assert whole["chunks"] == len(windows_by_hand()) and "chunks" not in head
    assert head["truncated"] and not whole["truncated"]


def test_the_cli_prints_the_logits_with_raw_scores(rerank_server, pair_server):
    endpoint = rerank_server[0].endpoint
    out = numaserve("rerank", QUERY, *DOCUMENTS, "--raw-scores", "--endpoint", endpoint)
    assert out.returncode == 0, out.stderr
    assert all(
        set(r) == {"index", "score", "logit", "tokens", "truncated"}
        for r in json.loads(out.stdout)["results"]
    )
    out = numaserve("classify", "a fox", "--raw-scores", "--endpoint", pair_server[0].endpoint)
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)["results"]
    assert len(result["logits"]) == len(result["probs"])


def test_the_cli_names_each_probability_by_the_models_label(pair_server):
    server, path = pair_server
    names = json.loads((path / "config.json").read_text())["id2label"]
    labels = [names[str(i)] for i in range(len(names))]
    out = numaserve("classify", "a fox", "--raw-scores", "--endpoint", server.endpoint)
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)["results"]
    assert list(result["probs"]) == labels and list(result["logits"]) == labels
    assert result["label"] == max(result["probs"], key=result["probs"].get)


def bench(endpoint: str, *options: str) -> dict:
    command = ("bench", *options, "--clients", "2", "--requests", "5", "--json")
    out = numaserve(*command, "--endpoint", endpoint)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_bench_drives_rerank_and_pairs(rerank_server, pair_server):
    reranked = bench(rerank_server[0].endpoint, "--op", "rerank", "--documents", "3")
    assert reranked["requests"] == 10 and reranked["errors"] == {}
    assert bench(pair_server[0].endpoint, "--op", "classify", "--pairs")["errors"] == {}
