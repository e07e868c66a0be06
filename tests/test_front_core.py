"""The front's core alone (front/core.py), the part every API shares: which model a call
names. The APIs over it against real servers: tests/test_http.py, tests/test_grpc_server.py."""

from __future__ import annotations

import pytest

from numaserve.config.schema import ConfigError, ModelConfig, ServerConfig, parse_config
from numaserve.front.core import Core
from numaserve.front.errors import ApiError
from numaserve.processes.specs import FrontModel, FrontSpec


def core(**server) -> Core:
    models = tuple(FrontModel(name, ModelConfig(), ()) for name in ("embed", "ranker"))
    spec = FrontSpec(models=models, named=True, server=ServerConfig(**server))
    return Core(spec, upstream=None, keys=None)


def test_a_call_that_names_no_model_of_several_is_told_the_models_served():
    with pytest.raises(ApiError) as refused:
        core().model(None, "the `model` metadata")
    assert refused.value.message == (
        "this server serves several models (embed, ranker): name one in the `model` metadata, "
        "or set server.default_model"
    )


def test_server_default_model_answers_a_call_that_names_none():
    assert core(default_model="ranker").model(None).name == "ranker"
    assert core(default_model="ranker").model("embed").name == "embed"


def test_a_default_model_that_is_not_served_is_refused_naming_those_that_are():
    models = "models: [{name: a}, {name: b}]\n"
    assert parse_config(models + "server: {default_model: b}").server.default_model == "b"
    with pytest.raises(ConfigError, match=r"server.default_model: c is not one of the models"):
        parse_config(models + "server: {default_model: c}")
