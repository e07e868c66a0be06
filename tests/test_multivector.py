"""Late interaction (task: multivector): a ColBERT checkpoint as sentence-transformers 6's
MultiVectorEncoder saves it, served by a real router shard and worker, its vectors against
MultiVectorEncoder's own encode_query and encode_document."""

import base64
import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from numaserve.backends import load_model
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.client import BadRequest, MultiVectors
from numaserve.config.schema import ModelConfig
from numaserve.tasks.sides import SidedPrompts, Sides
from numaserve.testing.cluster import Cluster
from numaserve.testing.windows import document
from tests.harness.checkpoints import (
    multi_vector_encoder,
    save_tiny_colbert,
    save_tiny_pylate_v3,
)
from tests.harness.console import numaserve

CONFIG = """
model: {{path: "{path}", task: multivector, backend: torch, quantize: none}}
server: {{heartbeat_ms: 200}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""
QUERIES = [
    "what is the capital of france?",
    "who wrote the origin of species, and when?",
    "a",
    "a question far longer than the query length of thirty two tokens, which a fixed "
    "expansion cuts to its length before it pads nothing at all, as colbert does",
]
DOCUMENTS = [
    "Paris is the capital of France. It is, indeed, a large city!",
    "Darwin's book (1859) changed biology; its full title is longer.",
    "x",
    "no punctuation here at all",
]


@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    return save_tiny_colbert(tmp_path_factory.mktemp("colbert"))


@pytest.fixture(scope="module")
def reference(colbert):
    return multi_vector_encoder(colbert)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, colbert):
    c = Cluster(tmp_path_factory.mktemp("multivector"), CONFIG.format(path=colbert))
    c.start()
    yield c
    c.stop()


def assert_same_vectors(served: list[MultiVectors], expected) -> None:
    for got, want in zip(served, expected, strict=True):
        want = want.numpy()
        assert got.vectors.shape == want.shape
        cosine = (got.vectors * want).sum(1) / (
            np.linalg.norm(got.vectors, axis=1) * np.linalg.norm(want, axis=1)
        )
        assert cosine.min() >= 0.9999, cosine.min()


def test_queries_are_encode_querys_vectors_expanded_to_the_query_length(cluster, reference):
    served = cluster.client().embed_multi(QUERIES, prompt_name="query")
    assert [len(s.vectors) for s in served] == [32] * len(QUERIES)
    assert_same_vectors(served, reference.encode_query(QUERIES))
    assert served[-1].truncated and not served[0].truncated


def test_documents_are_encode_documents_vectors_without_the_skiplists_tokens(cluster, reference):
    served = cluster.client().embed_multi(DOCUMENTS)
    assert_same_vectors(served, reference.encode_document(DOCUMENTS))
    assert len(served[0].vectors) < served[0].tokens  # its punctuation is left out
    assert len(served[3].vectors) == served[3].tokens - 2  # only "[D]"'s two brackets


def test_document_is_the_default_side(cluster):
    client = cluster.client()
    one = client.embed_multi("a text")
    two = client.embed_multi("a text", prompt_name="document")
    assert np.array_equal(one.vectors, two.vectors)


def test_the_cli_prints_a_querys_vectors_as_json(cluster, reference):
    out = numaserve("embed-multi", "--prompt-name", "query", "--endpoint", cluster.endpoint, "hi")
    assert out.returncode == 0, out.stderr
    (printed,) = json.loads(out.stdout)["results"]
    assert printed["tokens"] == 32 and not printed["truncated"]
    want = reference.encode_query(["hi"])[0].numpy()
    np.testing.assert_allclose(printed["vectors"], want, atol=1e-6)


def test_rerank_scores_each_document_by_maxsim_as_multi_vector_encoders_similarity(
    cluster, reference
):
    query = QUERIES[0]
    expected = reference.similarity(
        reference.encode_query([query]), reference.encode_document(DOCUMENTS)
    )[0].numpy()
    client = cluster.client()
    every = client.rerank(query, DOCUMENTS, raw_scores=True)
    assert [r.index for r in every] == list(range(len(DOCUMENTS)))
    np.testing.assert_allclose([r.logit for r in every], expected, rtol=1e-4)
    # the score: the mean of the query vectors' best cosines, MaxSim over their count
    np.testing.assert_allclose([r.score for r in every], expected / 32, rtol=1e-4)
    best = client.rerank(query, DOCUMENTS, top_k=2)
    assert [r.index for r in best] == list(np.argsort(-expected)[:2])
    assert all(r.logit is None for r in best)


def test_rerank_reads_a_long_document_in_windows_and_scores_all_their_vectors_by_maxsim(
    cluster, reference
):
    """Each window: "[D] " and 175 of the document's tokens (document_length 180), a quarter
    of them shared with the next; each query vector's best match anywhere in the document."""
    words = document(500).split()  # one token a word
    starts = range(0, 500 - 175 + 132, 132)
    windows = [" ".join(words[s : s + 175]) for s in starts]
    rows = torch.cat(reference.encode_document(windows))
    query = reference.encode_query([QUERIES[0]])[0]
    expected = float((query @ rows.T).max(dim=1).values.sum())
    client = cluster.client()
    (whole,) = client.rerank(QUERIES[0], [" ".join(words)], raw_scores=True)
    (cut,) = client.rerank(QUERIES[0], [" ".join(words)], max_chunks_per_doc=1)
    assert whole.chunks == len(windows) == 4 and not whole.truncated
    assert whole.logit == pytest.approx(expected, rel=1e-4)
    assert cut.chunks == 1 and cut.truncated and cut.score < whole.score


def test_token_pooling_pools_documents_as_hierarchical_token_pooling(cluster, reference):
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    client = cluster.client()
    served = client.embed_multi(DOCUMENTS, pool_factor=2)
    pooling = HierarchicalTokenPooling(pool_factor=2)
    assert_same_vectors(served, reference.encode_document(DOCUMENTS, token_pooling=pooling))
    whole = client.embed_multi(DOCUMENTS)
    assert [len(s.vectors) for s in served] == [1 + (len(w.vectors) - 1) // 2 for w in whole]
    query = client.embed_multi(QUERIES[0], prompt_name="query", pool_factor=2)
    assert len(query.vectors) == 32  # queries are not pooled, as sentence-transformers has it


def test_a_prompt_name_other_than_query_or_document_is_refused(cluster):
    with pytest.raises(BadRequest, match='prompt_name must be "query" or "document"'):
        cluster.client().embed_multi("a text", prompt_name="passage")


def test_each_stored_type_packs_vectors_as_sentence_transformers_and_cohere_do():
    from sentence_transformers.util.quantization import quantize_embeddings

    from numaserve.front.inputs import stored

    rng = np.random.default_rng(0)
    rows = rng.normal(size=(5, 48)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    for kind in ("binary", "ubinary"):
        np.testing.assert_array_equal(stored(rows, kind), quantize_embeddings(rows, kind))
    np.testing.assert_allclose(stored(rows, "float16").astype(np.float32), rows, atol=1e-3)
    assert stored(rows, "int8").dtype == np.int8 and stored(rows, "uint8").dtype == np.uint8
    np.testing.assert_allclose(stored(rows, "int8") / 127, rows, atol=0.5 / 127 + 1e-6)
    np.testing.assert_allclose(stored(rows, "uint8") / 127.5 - 1, rows, atol=0.5 / 127.5 + 1e-6)


# -- the model's own settings, on torch in one process -------------------------------------


def encode(path, texts, side: str) -> list[np.ndarray]:
    """What a router and a worker make of `texts` on `side`, in one process (torch, fp32)."""
    from numaserve.backends.tokenizer import Tokenizer

    config = ModelConfig(path=str(path), task="multivector", backend="torch", quantize="none")
    model = load_model(config)
    prompts = SidedPrompts(Sides.read(path, str(path)))
    encoded = prompts.fitted(side, Tokenizer(str(path), 256).encode(prompts.applied(side, texts)))
    rows = [model.run([list(e.ids)])[0] for e in encoded]
    skip = prompts.sides.skip_ids if side in prompts.sides.skip_sides else frozenset()
    return [r[[t not in skip for t in e.ids]] for r, e in zip(rows, encoded, strict=True)]


@pytest.mark.parametrize(
    "expansion",
    [
        {"strategy": "min", "length": 16},
        {"strategy": "fixed", "length": 24, "attend": True},
        {},  # none: a query is read as it is, cut to query_length
    ],
    ids=["min", "attended", "none"],
)
def test_each_query_expansion_reads_queries_as_encode_query(tmp_path, expansion):
    path = save_tiny_colbert(tmp_path, expansion=expansion, query_length=40)
    got = encode(path, QUERIES, "query")
    want = multi_vector_encoder(path).encode_query(QUERIES)
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-5)


def test_a_model_without_prompts_dense_or_skiplist_reads_both_sides_as_it_says(tmp_path):
    path = save_tiny_colbert(tmp_path, skiplist=False, dense=None, prompts={})
    reference = multi_vector_encoder(path)
    for side, want in (
        ("query", reference.encode_query(DOCUMENTS)),
        ("document", reference.encode_document(DOCUMENTS)),
    ):
        for g, w in zip(encode(path, DOCUMENTS, side), want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), atol=1e-5)


@pytest.mark.parametrize(
    "prefixes, model_type",
    [
        (("[unused0]", "[unused1]"), "ColBERT"),
        (("[Q] ", "[D] "), "ColBERT"),
        (("[Q] ", "[D] "), None),
    ],
    ids=["in-vocabulary", "added", "pylate-1.2"],
)
def test_pylates_saves_read_as_multi_vector_encoder_converts_them(tmp_path, prefixes, model_type):
    path = save_tiny_pylate_v3(tmp_path, *prefixes, model_type=model_type)
    reference = multi_vector_encoder(path)
    for side, want in (
        ("query", reference.encode_query(QUERIES)),
        ("document", reference.encode_document(DOCUMENTS)),
    ):
        got = encode(path, QUERIES if side == "query" else DOCUMENTS, side)
        assert [len(g) for g in got] == [len(w) for w in want], side
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), atol=1e-5)


def test_ctranslate2_is_refused_where_queries_expansion_is_not_attended_to(colbert):
    config = ModelConfig(
        path=str(colbert), task="multivector", backend="ctranslate2", quantize="none"
    )
    with pytest.raises(ModelLoadError, match=r"attend: false.*onnxruntime, openvino or torch"):
        load_model(config)


def test_a_colbert_served_as_an_embedding_model_is_refused_naming_the_task(colbert):
    with pytest.raises(ModelLoadError, match="serve it with task: multivector"):
        load_model(ModelConfig(path=str(colbert), task="embed", backend="torch", quantize="none"))


def test_modules_in_another_order_are_refused_naming_them(colbert, tmp_path):
    modules = json.loads((colbert / "modules.json").read_text())
    broken = tmp_path / "broken"
    broken.mkdir()
    for entry in colbert.iterdir():
        (broken / entry.name).symlink_to(entry)
    (broken / "modules.json").unlink()
    (broken / "modules.json").write_text(json.dumps([modules[0], modules[3], modules[1]]))
    with pytest.raises(ModelLoadError, match="Transformer -> MultiVectorMask -> Dense"):
        Sides.read(broken, "broken")


# -- through `numaserve start`: each path `quantize: auto` may keep, HTTP and gRPC ----------

SERVED = """
model: {{path: "{path}", task: multivector, backend: {backend}, quantize: {quantize}}}
server: {{endpoint: "@ENDPOINT@", grpc: "{grpc}"}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""


@dataclass
class Served:
    http: object  # an httpx.Client on its HTTP API
    grpc: str  # its gRPC API's address
    floor: float  # the lowest cosine to MultiVectorEncoder's vectors its path must reach


@pytest.fixture(
    scope="module", params=[("onnxruntime", "none"), ("auto", "auto")], ids=["fp32", "auto"]
)
def served(request, tmp_path_factory, colbert):
    """fp32 within 1e-4 of cosine 1; what `auto` keeps, within the accuracy gate's bars for
    token vectors (cosine >= 0.98 for every vector)."""
    import httpx

    from numaserve.testing.ports import free_port
    from tests.harness.server import Server

    backend, quantize = request.param
    address = f"127.0.0.1:{free_port()}"
    config = SERVED.format(path=colbert, backend=backend, quantize=quantize, grpc=address)
    server = Server(tmp_path_factory.mktemp("served"), config)
    try:
        server.wait_ready(timeout=600)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            yield Served(http, address, 0.9999 if quantize == "none" else 0.98)
    finally:
        server.stop()


def cosines(served_rows, expected) -> np.ndarray:
    a = np.asarray(served_rows, dtype=np.float32)
    b = expected.numpy() if hasattr(expected, "numpy") else np.asarray(expected)
    assert a.shape == b.shape
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.slow
@pytest.mark.outputs_only
def test_embed_all_answers_encode_querys_and_encode_documents_vectors(served, reference):
    queries = served.http.post("/embed_all", json={"inputs": QUERIES, "prompt_name": "query"})
    documents = served.http.post("/embed_all", json={"inputs": DOCUMENTS})
    expected = [*reference.encode_query(QUERIES), *reference.encode_document(DOCUMENTS)]
    for got, want in zip([*queries.json(), *documents.json()], expected, strict=True):
        assert cosines(got, want).min() >= served.floor
    info = served.http.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "multivector"}}


@pytest.mark.slow
@pytest.mark.outputs_only
def test_embed_all_of_more_texts_than_a_shard_takes_at_once_is_answered_whole(served):
    one = served.http.post("/embed_all", json={"inputs": DOCUMENTS}).json()
    many = served.http.post("/embed_all", json={"inputs": DOCUMENTS * 40}).json()  # 3 pieces
    assert [len(m) for m in many] == [len(d) for d in one] * 40


@pytest.mark.slow
@pytest.mark.outputs_only
def test_embed_all_answers_the_types_a_vector_store_keeps_in_base64(served):
    body = {"inputs": DOCUMENTS, "embedding_type": "ubinary", "encoding_format": "base64"}
    floats = served.http.post("/embed_all", json={"inputs": DOCUMENTS}).json()
    bits = served.http.post("/embed_all", json=body).json()
    halves = served.http.post("/embed_all", json={**body, "embedding_type": "float16"}).json()
    for vectors, rows, half in zip(floats, bits, halves, strict=True):
        decoded = [np.frombuffer(base64.b64decode(r), np.uint8) for r in rows]
        np.testing.assert_array_equal(decoded, np.packbits(np.array(vectors) > 0, axis=-1))
        values = [np.frombuffer(base64.b64decode(r), "<f2") for r in half]
        np.testing.assert_allclose(values, vectors, atol=1e-3)
    wrong = served.http.post("/embed_all", json={**body, "embedding_type": "int4"})
    assert wrong.status_code == 422 and "embedding_type must be one of" in wrong.text


@pytest.mark.slow
@pytest.mark.outputs_only
def test_teis_and_coheres_rerank_score_by_maxsim(served, reference):
    maxsim = reference.similarity(
        reference.encode_query(QUERIES[:1]), reference.encode_document(DOCUMENTS)
    )[0].numpy()
    body = {"query": QUERIES[0], "texts": DOCUMENTS}
    ranks = {r["index"]: r["score"] for r in served.http.post("/rerank", json=body).json()}
    v2 = served.http.post("/v2/rerank", json={"query": QUERIES[0], "documents": DOCUMENTS})
    mean_best = maxsim / 32  # the score: MaxSim over the query's 32 vectors
    np.testing.assert_allclose([ranks[i] for i in range(len(DOCUMENTS))], mean_best, atol=0.02)
    assert [r["index"] for r in v2.json()["results"]] == sorted(ranks, key=lambda i: -ranks[i])


@pytest.mark.slow
@pytest.mark.outputs_only
def test_grpc_embed_all_reads_a_query_and_info_names_an_embedding_model(served, reference):
    import grpc

    from numaserve.grpc_api.proto import tei

    pb, stubs = tei()
    with grpc.insecure_channel(served.grpc) as channel:
        request = pb.EmbedAllRequest(inputs=QUERIES[0], prompt_name="query")
        answer = stubs.EmbedStub(channel).EmbedAll(request)
        info = stubs.InfoStub(channel).Info(pb.InfoRequest())
    rows = [t.embeddings for t in answer.token_embeddings]
    assert cosines(rows, reference.encode_query(QUERIES[:1])[0]).min() >= served.floor
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
