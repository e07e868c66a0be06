"""TEI's gRPC API against real servers of two real (tiny) models each, each of TEI's services
answered as the same server's HTTP API answers TEI's routes: a client generated from TEI's
proto, naming each model in its `model` metadata (a `models:` server). The API's parts, and
its errors, on a front alone: tests/test_grpc_api.py."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from numaserve.grpc_api.proto import tei
from numaserve.testing.ports import free_port
from tests.harness import server as server_
from tests.harness.checkpoints import (
    save_tiny_cross_encoder,
    save_tiny_embedder,
    save_tiny_model,
    save_tiny_splade,
)

pytestmark = pytest.mark.slow

EMBEDDERS = """
models:
  - {{name: embedder, path: "{embedder}", max_length: 32, backend: onnxruntime, quantize: none,
      pools: [{{name: main, max_tokens: 32, instances: 1}}]}}
  - {{name: splade, path: "{splade}", task: sparse, max_length: 32, backend: onnxruntime,
      quantize: none, pools: [{{name: main, max_tokens: 32, instances: 1}}]}}
server: {{endpoint: "@ENDPOINT@", grpc: "{grpc}", max_batch: 4}}
"""
PAIRS = """
models:
  - {{name: toxicity, path: "{classifier}", task: classify, max_length: 32, backend: onnxruntime,
      quantize: none, pools: [{{name: main, max_tokens: 32, instances: 1}}]}}
  - {{name: ranker, path: "{ranker}", task: rerank, max_length: 32, backend: onnxruntime,
      quantize: none, pools: [{{name: main, max_tokens: 32, instances: 1}}]}}
server: {{endpoint: "@ENDPOINT@", grpc: "{grpc}", max_batch: 4}}
"""
TEXTS = ["a first text", "the second one, a little longer", "third"]


def serve(directory, config: str, **models):
    """A real server of `config`, with its gRPC channel and an HTTP client."""
    address = f"127.0.0.1:{free_port()}"
    s = server_.Server(directory, config.format(grpc=address, **models))
    s.wait_ready()
    with grpc.insecure_channel(address) as channel, httpx.Client(base_url=s.url, timeout=30) as h:
        yield channel, h
    s.stop()


@pytest.fixture(scope="module")
def embedders(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grpc-embedders")
    yield from serve(
        directory,
        EMBEDDERS,
        embedder=save_tiny_embedder(directory / "embedder", "mean"),
        splade=save_tiny_splade(directory / "splade"),
    )


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grpc-pairs")
    yield from serve(
        directory,
        PAIRS,
        classifier=save_tiny_model(directory / "classifier", "bert", "classify"),
        ranker=save_tiny_cross_encoder(directory / "ranker"),
    )


def named(model: str) -> tuple:
    return (("model", model),)


def test_embed_and_its_stream_answer_the_http_apis_vectors(embedders):
    channel, http = embedders
    pb, stubs = tei()
    embed = stubs.EmbedStub(channel)
    expected = http.post("/embed", json={"model": "embedder", "inputs": TEXTS}).json()
    one = embed.Embed(pb.EmbedRequest(inputs=TEXTS[0]), metadata=named("embedder"))
    streamed = embed.EmbedStream(
        iter([pb.EmbedRequest(inputs=t) for t in TEXTS]), metadata=named("embedder")
    )
    np.testing.assert_allclose(one.embeddings, expected[0], atol=1e-6)
    np.testing.assert_allclose([r.embeddings for r in streamed], expected, atol=1e-6)


def test_embed_all_and_embed_sparse_answer_the_http_apis_vectors_and_weights(embedders):
    channel, http = embedders
    pb, stubs = tei()
    embed = stubs.EmbedStub(channel)
    tokens = http.post("/embed_all", json={"model": "embedder", "inputs": TEXTS[1]}).json()[0]
    every = embed.EmbedAll(pb.EmbedAllRequest(inputs=TEXTS[1]), metadata=named("embedder"))
    np.testing.assert_allclose([t.embeddings for t in every.token_embeddings], tokens, atol=1e-6)
    sparse = http.post("/embed_sparse", json={"model": "splade", "inputs": TEXTS[1]}).json()[0]
    weights = embed.EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS[1]), metadata=named("splade"))
    assert [v.index for v in weights.sparse_embeddings] == [v["index"] for v in sparse]
    np.testing.assert_allclose(
        [v.value for v in weights.sparse_embeddings], [v["value"] for v in sparse], rtol=1e-6
    )


def test_predict_and_predict_pair_answer_the_http_apis_labels_and_scores(pairs):
    channel, http = pairs
    pb, stubs = tei()
    predict = stubs.PredictStub(channel)
    body = {"model": "toxicity", "inputs": [[TEXTS[0]], TEXTS[:2]], "raw_scores": True}
    one_http, pair_http = http.post("/predict", json=body).json()
    one = predict.Predict(
        pb.PredictRequest(inputs=TEXTS[0], raw_scores=True), metadata=named("toxicity")
    )
    pair = predict.PredictPair(
        pb.PredictPairRequest(inputs=TEXTS[:2], raw_scores=True), metadata=named("toxicity")
    )
    for got, expected in ((one, one_http), (pair, pair_http)):
        assert [p.label for p in got.predictions] == [p["label"] for p in expected]
        np.testing.assert_allclose(
            [p.score for p in got.predictions], [p["score"] for p in expected], rtol=1e-5
        )


def test_rerank_and_rerank_stream_rank_as_the_http_api(pairs):
    channel, http = pairs
    pb, stubs = tei()
    rerank = stubs.RerankStub(channel)
    query, texts = "which one", TEXTS
    expected = http.post("/rerank", json={"model": "ranker", "query": query, "texts": texts}).json()
    ranked = rerank.Rerank(
        pb.RerankRequest(query=query, texts=texts, return_text=True), metadata=named("ranker")
    )
    streamed = rerank.RerankStream(
        iter([pb.RerankStreamRequest(query=query, text=t) for t in texts]),
        metadata=named("ranker"),
    )
    for got in (ranked, streamed):
        assert [r.index for r in got.ranks] == [r["index"] for r in expected]
        np.testing.assert_allclose(
            [r.score for r in got.ranks], [r["score"] for r in expected], rtol=1e-5
        )
    assert [r.text for r in ranked.ranks] == [texts[r["index"]] for r in expected]


def test_a_text_too_long_is_invalid_argument_unless_the_message_says_truncate(embedders):
    channel, _ = embedders
    pb, stubs = tei()
    embed = stubs.EmbedStub(channel).Embed
    long = "word " * 100
    with pytest.raises(grpc.RpcError) as refused:
        embed(pb.EmbedRequest(inputs=long), metadata=named("embedder"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    cut = embed(pb.EmbedRequest(inputs=long, truncate=True), metadata=named("embedder"))
    assert cut.metadata.compute_tokens == 32


def test_a_model_unnamed_on_a_models_server_or_unknown_is_refused_naming_the_served(embedders):
    channel, _ = embedders
    pb, stubs = tei()
    embed = stubs.EmbedStub(channel).Embed
    with pytest.raises(grpc.RpcError) as unnamed:
        embed(pb.EmbedRequest(inputs="a"))
    assert unnamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "name one in the `model` metadata" in unnamed.value.details()
    with pytest.raises(grpc.RpcError) as unknown:
        embed(pb.EmbedRequest(inputs="a"), metadata=named("nope"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_info_names_each_models_type(embedders, pairs):
    pb, stubs = tei()

    def model_type(served, model: str):
        channel, _ = served
        return stubs.InfoStub(channel).Info(pb.InfoRequest(), metadata=named(model)).model_type

    assert model_type(embedders, "embedder") == pb.MODEL_TYPE_EMBEDDING
    assert model_type(pairs, "toxicity") == pb.MODEL_TYPE_CLASSIFIER
    assert model_type(pairs, "ranker") == pb.MODEL_TYPE_RERANKER
