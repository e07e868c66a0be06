from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"


@pytest.fixture
def sysfs():
    """Path of a committed sysfs fixture tree, by machine name."""
    return lambda name: SYSFS / name


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory):
    """A small BertForSequenceClassification saved with save_pretrained, with a real tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from numaserve.modelpath import resolve_model_path

    path = tmp_path_factory.mktemp("classifier")
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        num_labels=3,
        id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    BertForSequenceClassification(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    return path
