"""The embedding architectures users pick now (NomicBERT, GTE, jina-embeddings-v3, EuroBERT,
Qwen3, Gemma3), each saved small as sentence-transformers saves the published checkpoints,
served on every backend that converts it and checked against sentence-transformers' `encode`
on the same directory; refused before any build where a backend cannot convert it.
EmbeddingGemma's whole pipeline (Gemma3, mean pooling, two Dense projections, Normalize, its
prompts, Matryoshka dimensions) through a real server."""

import httpx
import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.client import Client
from numaserve.config.schema import ModelConfig
from numaserve.testing.server import ENDPOINT, Server
from tests.harness.checkpoints import embedders, save_tiny_embedder
from tests.test_architectures import TEXTS, served

# Outputs judged against reference libraries, nothing timed: CI runs the slow ones on two
# workers (.ci/run).
pytestmark = pytest.mark.outputs_only
EMBEDDERS = sorted(embedders())
# EmbeddingGemma's prompts, as its sentence-transformers config names them.
GEMMA_PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "STS": "task: sentence similarity | query: ",
}
GEMMA_DENSE = ((256, "Identity", False), (64, "Identity", False))  # its two, without bias


def save(tmp_path, name: str, **extra):
    config, pooling = embedders()[name]
    return save_tiny_embedder(tmp_path / name, pooling, config=config(), **extra)


def reference(path, texts=TEXTS, **options) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(texts, **options)


def assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


@pytest.mark.parametrize("name", EMBEDDERS)
def test_torch_serves_each_as_sentence_transformers_encodes_it(tmp_path, name):
    path = save(tmp_path, name)
    assert_same(served(path, "embed", "torch", "none"), reference(path))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("name", EMBEDDERS)
def test_the_onnx_paths_serve_each_as_sentence_transformers_encodes_it(tmp_path, name, backend):
    path = save(tmp_path, name)
    assert_same(served(path, "embed", backend, "none"), reference(path))


@pytest.mark.slow
@pytest.mark.parametrize("name", EMBEDDERS)
def test_openvinos_pytorch_frontend_converts_each_as_transformers_runs_it(tmp_path, name):
    # What OpenVINO's int8 is quantized from (openvino_build.convert), at fp32.
    import torch

    from numaserve.backends.openvino_build import convert
    from numaserve.backends.openvino_runtime import import_openvino
    from numaserve.backends.torch import load_transformers_model
    from tests.test_onnx import token_ids

    config = ModelConfig(path=str(save(tmp_path, name)), task="embed")
    model = load_transformers_model(config)
    # f32 named, as the backend names it: OpenVINO runs bf16 by default on a CPU with
    # AVX512_BF16 or AMX (seen: differences of 0.014 on such a CPU).
    precision = {"INFERENCE_PRECISION_HINT": "f32"}
    compiled = import_openvino().Core().compile_model(convert(model, config), "CPU", precision)
    for ids in token_ids(config.path, TEXTS):
        feeds = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), int)}
        with torch.no_grad():
            theirs = model(**{k: torch.tensor(v) for k, v in feeds.items()}).last_hidden_state
        np.testing.assert_allclose(compiled(feeds)[0], theirs.numpy(), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", EMBEDDERS)
def test_openvinos_int8_serves_each_near_sentence_transformers(tmp_path, name):
    # Random weights make int8 less accurate than trained ones (the gate judges those).
    path = save(tmp_path, name)
    ours, theirs = served(path, "embed", "openvino", "int8"), reference(path)
    assert (ours * theirs).sum(axis=1).min() >= 0.9  # both unit length


@pytest.mark.parametrize("name", EMBEDDERS)
def test_ctranslate2_refuses_each_in_one_line_naming_what_serves_it(tmp_path, name):
    path = save(tmp_path, name)
    config = ModelConfig(path=str(path), task="embed", backend="ctranslate2", quantize="none")
    with pytest.raises(ModelLoadError) as e:
        load_model(config)
    message = str(e.value)
    assert "\n" not in message and f"this is {name}" in message
    assert "use model.backend: onnxruntime or auto" in message


def test_embeddinggemmas_two_dense_projections_run_on_torch(tmp_path):
    path = save(tmp_path, "gemma3_text", dense=GEMMA_DENSE)
    assert_same(served(path, "embed", "torch", "none"), reference(path))


@pytest.fixture(scope="module")
def embeddinggemma(tmp_path_factory):
    """An EmbeddingGemma-shaped checkpoint served from its ONNX export (fp32), one instance."""
    directory = tmp_path_factory.mktemp("embeddinggemma")
    path = save(directory, "gemma3_text", dense=GEMMA_DENSE, prompts=GEMMA_PROMPTS)
    server = Server(
        directory,
        f'model: {{path: "{path}", backend: onnxruntime, quantize: none}}\n'
        f'server: {{endpoint: "{ENDPOINT}"}}\n'
        "placement: {pools: [{name: main, max_tokens: 256, instances: 1}]}\n",
    )
    server.wait_ready()
    yield server, path
    server.stop()


@pytest.mark.slow
def test_embeddinggemma_embeds_with_each_prompt_as_sentence_transformers_does(embeddinggemma):
    server, path = embeddinggemma
    with Client(server.endpoint, timeout=60) as client:
        for name in ("query", "document", None):
            got = np.stack([e.vector for e in client.embed(TEXTS, prompt_name=name)])
            assert_same(got, reference(path, prompt_name=name))


@pytest.mark.slow
@pytest.mark.parametrize("dimensions", [64, 32, 16, 8])
def test_embeddinggemma_cuts_to_matryoshka_dimensions_as_truncate_dim_does(
    embeddinggemma, dimensions
):
    server, path = embeddinggemma
    reply = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"input": TEXTS, "dimensions": dimensions},
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    got = np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)
    theirs = reference(path, truncate_dim=dimensions, normalize_embeddings=True)
    assert got.shape == (len(TEXTS), dimensions)
    assert_same(got, theirs)
