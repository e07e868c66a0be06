"""An embedding model's own prompts (config_sentence_transformers.json's `prompts` and
`default_prompt_name`, as E5, BGE and GTE ship them): named by a request over ZeroMQ or HTTP,
the model's default where none is named, each against sentence-transformers' `encode`."""

import numpy as np
import pytest

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.client import Client, NumaserveError
from numaserve.tasks.prompts import Prompts
from numaserve.tasks.requests import RequestError, parse_request
from numaserve.testing.server import ENDPOINT, Server
from tests.harness.checkpoints import save_tiny_embedder
from tests.harness.console import numaserve

PROMPTS = {"query": "query: ", "passage": "passage: ", "plain": ""}
TEXTS = ["What is the capital of France?", "Paris is the capital of France."]


def test_the_named_prompt_else_the_default_goes_before_each_text():
    prompts = Prompts(PROMPTS, "query")
    assert prompts.applied("passage", ["a"]) == ["passage: a"]
    assert prompts.applied(None, ["a", "b"]) == ["query: a", "query: b"]
    assert prompts.applied("plain", ["a"]) == ["a"]
    assert Prompts().applied(None, ["a"]) == ["a"]


def test_a_prompt_the_model_does_not_have_names_the_ones_it_has():
    with pytest.raises(ValueError, match=r"'doc' is not one of this model's prompts \(query, "):
        Prompts(PROMPTS).applied("doc", ["a"])


def test_a_default_prompt_name_that_is_not_a_prompt_is_refused_at_load(tmp_path):
    (tmp_path / "config_sentence_transformers.json").write_text(
        '{"prompts": {"query": "q: "}, "default_prompt_name": "passage"}'
    )
    with pytest.raises(ModelLoadError, match="default_prompt_name 'passage' is not one of"):
        Prompts.read(tmp_path)


def test_a_model_whose_pooling_leaves_its_prompts_out_is_refused(tmp_path):
    import json

    from numaserve.tasks.embed import EMBED

    path = save_tiny_embedder(tmp_path / "model", "mean", prompts={"query": "query: "})
    pooling = path / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    with pytest.raises(ModelLoadError, match="leaves a prompt's tokens out"):
        EMBED.check_checkpoint(path, str(path))


def test_prompt_name_is_an_embed_and_multivector_option_and_a_string():
    body = {"id": 1, "op": "embed", "texts": ["a"], "prompt_name": "query"}
    assert parse_request(body, 8).options["prompt_name"] == "query"
    with pytest.raises(RequestError, match="prompt_name must be a prompt's name"):
        parse_request({**body, "prompt_name": 3}, 8)
    with pytest.raises(
        RequestError, match="prompt_name is for embed and multivector, not classify"
    ):
        parse_request({**body, "op": "classify"}, 8)


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("prompts")
    path = save_tiny_embedder(
        directory / "model", "mean", prompts=PROMPTS, default_prompt_name="query"
    )
    server = Server(
        directory,
        f'model: {{path: "{path}", backend: torch, quantize: none}}\n'
        f'server: {{endpoint: "{ENDPOINT}"}}\n'
        "placement: {pools: [{name: main, max_tokens: 256, instances: 1}]}\n",
    )
    server.wait_ready()
    yield server, path
    server.stop()


def reference(path, **prompt) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(TEXTS, **prompt)


@pytest.mark.slow
def test_over_zeromq_each_prompt_embeds_as_sentence_transformers_does(prompted):
    server, path = prompted
    with Client(server.endpoint, timeout=30) as client:
        for name in ("passage", "plain", None):
            got = np.stack([e.vector for e in client.embed(TEXTS, prompt_name=name)])
            np.testing.assert_allclose(got, reference(path, prompt_name=name), atol=1e-5)
        with pytest.raises(NumaserveError, match="not one of this model's prompts"):
            client.embed(TEXTS, prompt_name="doc")


@pytest.mark.slow
def test_over_http_embed_and_similarity_take_teis_prompt_name(prompted):
    import httpx

    server, path = prompted
    with httpx.Client(base_url=server.url, timeout=30) as http:
        embedded = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "passage"})
        default = http.post("/embed", json={"inputs": TEXTS})
        similar = http.post(
            "/similarity",
            json={
                "inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS},
                "parameters": {"prompt_name": "passage"},
            },
        )
        unknown = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "doc"})
    passage = reference(path, prompt_name="passage")
    np.testing.assert_allclose(embedded.json(), passage, atol=1e-5)
    np.testing.assert_allclose(default.json(), reference(path), atol=1e-5)
    np.testing.assert_allclose(similar.json(), passage @ passage[0], atol=1e-5)
    assert unknown.status_code == 422 and "passage, plain" in unknown.json()["error"]


@pytest.mark.slow
def test_the_cli_embeds_with_a_named_prompt(prompted):
    import json

    server, path = prompted
    out = numaserve("embed", "--endpoint", server.endpoint, "--prompt-name", "passage", TEXTS[0])
    assert out.returncode == 0, out.stderr
    vector = json.loads(out.stdout)["results"][0]["embedding"]
    np.testing.assert_allclose(vector, reference(path, prompt_name="passage")[0], atol=2e-5)
