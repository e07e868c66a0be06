"""A text longer than the model reads, embedded in windows where a request asks
(max_chunks_per_doc): the mean of its windows' vectors, unit length, against
sentence-transformers' own vectors of the same windows. A real router and worker."""

import json
import warnings

import numpy as np
import pytest

from numaserve.client import BadRequest
from numaserve.testing.cluster import Cluster
from tests.harness.checkpoints import save_tiny_embedder
from tests.test_pairs import LONG_DOCUMENT, hf_tokenizer

MAX_LENGTH = 32


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path = save_tiny_embedder(tmp_path_factory.mktemp("embedder") / "m", "mean", normalize=False)
    config = path / "sentence_bert_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_seq_length": MAX_LENGTH}))
    running = Cluster(
        tmp_path_factory.mktemp("cluster"),
        f"model: {{path: {path}, backend: torch, quantize: none}}\n"
        f"placement: {{pools: [{{name: main, max_tokens: {MAX_LENGTH}, instances: 1}}]}}\n",
    ).start()
    yield running, path
    running.stop()


def windows_by_hand() -> list[str]:
    """LONG_DOCUMENT's windows as texts: MAX_LENGTH less its two special tokens, each
    overlapping the next by a quarter of that (its words are one token each)."""
    tokenizer = hf_tokenizer()
    words = tokenizer(LONG_DOCUMENT, add_special_tokens=False)["input_ids"]
    room = MAX_LENGTH - 2
    step = room - room // 4
    starts = range(0, max(1, len(words) - room + step), step)
    return [tokenizer.decode(words[s : s + room]) for s in starts]


def sentence_transformers_vectors(path, texts) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(path), device="cpu").encode(texts)


def test_a_long_text_asked_in_windows_gets_their_mean_vector(embedder):
    server, path = embedder
    windows = windows_by_hand()
    mean = sentence_transformers_vectors(path, windows).mean(axis=0)
    with server.client() as client:
        whole = client.embed(LONG_DOCUMENT, max_chunks_per_doc=16)
        cut = client.embed(LONG_DOCUMENT)  # not asked: cut, as before
        two = client.embed(LONG_DOCUMENT, max_chunks_per_doc=2)
    assert whole.chunks == len(windows) > 2 and not whole.truncated
    np.testing.assert_allclose(whole.vector, mean / np.linalg.norm(mean), atol=1e-5)
    assert cut.chunks == 1 and cut.truncated and cut.tokens == MAX_LENGTH
    head = sentence_transformers_vectors(path, windows[:2]).mean(axis=0)
    assert two.chunks == 2 and two.truncated
    np.testing.assert_allclose(two.vector, head / np.linalg.norm(head), atol=1e-5)


def test_token_vectors_read_a_text_once_so_windows_cannot_go_with_them(embedder):
    server, _ = embedder
    with server.client() as client, pytest.raises(BadRequest, match="cannot go with it"):
        client.call("embed", ["a text"], token_vectors=True, max_chunks_per_doc=4)
