"""Token vectors (embed's `token_vectors`, TEI's /embed_all): each token's vector of the
model's last hidden state, unpooled, held against sentence-transformers'
`encode(output_value="token_embeddings")`. Over real sockets: tests/test_http.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.schema import ModelConfig
from numaserve.tasks.requests import RequestError, parse_request
from tests.harness.checkpoints import save_tiny_embedder

TEXTS = ["What is the capital of France?", "a fox", "Paris is the capital of France."]


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_the_rows_asked_for_are_the_token_vectors_sentence_transformers_gives(tmp_path, backend):
    path = save_tiny_embedder(tmp_path / "e", "mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SentenceTransformer

        theirs = SentenceTransformer(str(path), device="cpu").encode(
            TEXTS, output_value="token_embeddings"
        )
    config = ModelConfig(path=str(path), backend=backend, quantize="none", max_length=64)
    batch = [list(e.ids) for e in Tokenizer(config.path, 64).encode(TEXTS)]
    results = load_model(config).run(batch, whole=[0, 2])
    for i in (0, 2):
        assert results[i].shape == (len(batch[i]), 64)
        np.testing.assert_allclose(results[i], theirs[i].numpy(), atol=1e-4)
    assert results[1].shape == (64,)  # the others pooled, as ever


def test_token_vectors_must_be_a_boolean_and_is_for_embed_alone():
    body = {"id": 1, "op": "embed", "texts": ["a"], "token_vectors": "yes"}
    with pytest.raises(RequestError, match="token_vectors must be true or false"):
        parse_request(body, 8)
    with pytest.raises(RequestError, match="token_vectors is for embed, not classify"):
        parse_request({**body, "op": "classify", "token_vectors": True}, 8)
