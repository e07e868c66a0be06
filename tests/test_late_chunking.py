"""Late chunking: a text run once through a real router shard and worker, each chunk's vector
pooled from its own tokens of that pass, against transformers' whole-text pass pooled the
same way (fp32, within 1e-4)."""

import numpy as np
import pytest

from numaserve.client import BadRequest
from numaserve.testing.cluster import Cluster
from tests.harness.checkpoints import save_tiny_embedder

CONFIG = """
model: {{path: "{path}", backend: torch, quantize: none, max_length: 256}}
server: {{heartbeat_ms: 200, max_texts: 64}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""
TEXT = (
    "Berlin is the capital of Germany. It has about 3.8 million people. The city is known for "
    "its art scene, and for the wall that split it until 1989. Today it draws students from "
    "everywhere, who stay for the rents, which are rising, and the nights, which are long."
)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return save_tiny_embedder(tmp_path_factory.mktemp("embedder"), "mean")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, embedder):
    c = Cluster(tmp_path_factory.mktemp("late"), CONFIG.format(path=embedder))
    c.start()
    yield c
    c.stop()


def whole_pass(path, text: str) -> tuple[np.ndarray, list]:
    """transformers' last hidden state of the whole text, and each token's character span."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    encoded = tokenizer(text, return_tensors="pt", return_offsets_mapping=True)
    offsets = encoded.pop("offset_mapping")[0].tolist()
    with torch.inference_mode():
        rows = AutoModel.from_pretrained(str(path)).eval()(**encoded).last_hidden_state[0]
    return rows.numpy(), offsets


def pooled(rows: np.ndarray, positions: list[int]) -> np.ndarray:
    mean = rows[positions].mean(0)
    return mean / np.linalg.norm(mean)


def test_chunks_of_n_tokens_are_the_means_of_their_tokens_from_one_whole_pass(cluster, embedder):
    rows, _ = whole_pass(embedder, TEXT)
    content = list(range(1, len(rows) - 1))  # [CLS] and [SEP] aside
    expected = [pooled(rows, content[i : i + 16]) for i in range(0, len(content), 16)]
    (got,) = cluster.client().embed_chunks([TEXT], chunk_tokens=16)
    assert got.vectors.shape == (len(expected), 64) and got.tokens == len(rows)
    np.testing.assert_allclose(got.vectors, expected, atol=1e-4)


def test_character_spans_pool_the_tokens_they_hold(cluster, embedder):
    rows, offsets = whole_pass(embedder, TEXT)
    inside = TEXT.index("has") + 1  # one character of a word: its token
    spans = [
        (0, TEXT.index(" It")),
        (TEXT.index("It"), TEXT.index(" The city")),
        (inside, inside + 1),
    ]
    expected = [
        pooled(rows, [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start])
        for start, end in spans
    ]
    got = cluster.client().embed_chunks(TEXT, spans=spans)
    np.testing.assert_allclose(got.vectors, expected, atol=1e-4)


def test_a_span_that_holds_no_token_is_a_zero_vector(cluster):
    space = TEXT.index(" ")
    (vector,) = cluster.client().embed_chunks(TEXT, spans=[(space, space + 1)]).vectors
    assert not vector.any()


def test_a_chunk_reads_the_whole_text_not_only_itself(cluster):
    first = TEXT.index(" It")
    alone = cluster.client().embed(TEXT[:first]).vector
    (chunk,) = cluster.client().embed_chunks(TEXT, spans=[(0, first)]).vectors
    assert float(alone @ chunk) < 0.9999  # its tokens attended to the rest of the text


def test_spans_for_another_number_of_texts_are_refused(cluster):
    with pytest.raises(BadRequest, match="a list of spans for each of the 2 texts"):
        cluster.client().embed_chunks(["a", "b"], spans=[[(0, 1)]])


LONG_CONTEXT = ("nomic_bert", "gte", "jina_embeddings_v3", "eurobert", "modernbert")


@pytest.mark.parametrize("architecture", LONG_CONTEXT)
def test_each_long_context_architecture_chunks_late_as_its_whole_pass_pools(tmp_path, architecture):
    """The router's and worker's parts in one process (torch, fp32), for each architecture."""
    from numaserve.backends import load_model
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.config.schema import ModelConfig
    from numaserve.tasks.late_chunking import chunk_tokens, chunk_vectors
    from numaserve.tasks.pooling import Pooling
    from tests.harness.checkpoints import architectures, embedders

    configs = {**{k: make for k, (make, _) in embedders().items()}, **architectures()}
    path = save_tiny_embedder(tmp_path, "mean", config=configs[architecture]())
    model = load_model(ModelConfig(path=str(path), backend="torch", quantize="none"))
    (encoded,) = Tokenizer(str(path), 256).encode_tagged([TEXT])
    (rows,) = model.run([list(encoded.ids)], whole=[0])
    chunks = chunk_tokens({"tokens": 16}, 0, encoded.tokens, 0)
    got = chunk_vectors(rows, chunks, Pooling.read(path))
    expected_rows, _ = whole_pass(path, TEXT)
    np.testing.assert_allclose(got, [pooled(expected_rows, c) for c in chunks], atol=1e-4)


def test_spans_for_more_texts_than_one_request_takes_go_with_their_texts(cluster):
    """The server takes 64 texts a request (server.max_texts), so the client sends 70 in two:
    each with its own texts' spans."""
    texts = [f"text {i} of many" for i in range(70)]
    spans = [[(0, 4)] * (1 + i % 3) for i in range(70)]
    got = cluster.client().embed_chunks(texts, spans=spans)
    assert [len(g.vectors) for g in got] == [1 + i % 3 for i in range(70)]
