"""The YAML config: typed, validated, with errors that name the file and the key."""

import typing
from pathlib import Path

import pytest

from numaserve.config.schema import (
    AUTO,
    Config,
    ConfigError,
    PoolConfig,
    load_config,
    parse_config,
    with_checkpoint_lengths,
)
from numaserve.host.topology import CORE_TYPES

CONFIGS = Path(__file__).parents[1] / "configs"
GOOD = """
model: {path: bundled:minilm, task: embed, quantize: int8, max_length: 128}
placement:
  reserved_cores: 1
  pools:
    - {name: short, max_tokens: 32, cores_per_instance: 1, instances: auto}
    - {name: long, max_tokens: 512, cores_per_instance: 4, instances: 2}
"""


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_configs_load(name):
    config = load_config(CONFIGS / name)
    assert config.source.endswith(name)


def test_values_become_typed_objects():
    config = parse_config(GOOD)
    assert config.model.max_length == 128
    assert config.placement.reserved_cores == 1
    short, long = config.placement.pools
    assert (short.instances, long.instances, long.cores_per_instance) == (AUTO, 2, 4)


def test_empty_file_means_all_defaults():
    assert with_checkpoint_lengths(parse_config("")) == Config(source="<string>")


def test_checking_a_config_reads_no_model_and_loading_it_reads_its_length(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sentence_bert_config.json").write_text("{broken")  # read only at load
    text = f"models: [{{name: a, path: {tmp_path}}}, {{name: b, max_length: 128}}]"
    checked = parse_config(text, source="my.yaml")
    assert checked.unset_max_length == (0,)  # a's is its checkpoint's: not read yet
    with pytest.raises(ConfigError, match=r"my.yaml: models\[0\].max_length is not set, and"):
        with_checkpoint_lengths(checked)
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 64}')
    a, b = with_checkpoint_lengths(checked).models
    assert (a.max_length, b.max_length) == (64, 128)


def error(text):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="my.yaml")
    return str(e.value)


def test_unknown_key_is_named_with_its_path_and_the_known_keys():
    msg = error("model: {path: x, taks: embed}")
    assert msg.startswith("my.yaml: model.taks: unknown key")
    assert "task" in msg


def test_every_mistake_of_a_config_is_named_at_once_a_line_each():
    lines = error("model: {taks: embed, max_length: long}\nserver: {max_batch: 0}").splitlines()
    assert lines[0] == "my.yaml: 3 mistakes:"
    assert [line.split(": ")[:2] for line in lines[1:]] == [
        ["my.yaml", "model.taks"],
        ["my.yaml", "model.max_length"],
        ["my.yaml", "server.max_batch"],
    ]


def test_unknown_section_is_named():
    assert error("modle: {}").startswith("my.yaml: modle: unknown key")


def test_wrong_type_names_the_key_and_what_was_given():
    assert error("model: {max_length: long}") == (
        "my.yaml: model.max_length: expected an integer, got str 'long'"
    )


def test_boolean_is_not_accepted_as_an_integer():
    assert "expected an integer" in error("placement: {reserved_cores: true}")


def test_integer_is_not_accepted_as_a_boolean():
    assert "expected true or false" in error("placement: {smt: 1}")


def test_value_outside_the_choices_lists_them():
    assert error("model: {task: summarize}") == (
        "my.yaml: model.task: must be one of embed, classify, rerank, ner, sparse, multivector; "
        "got 'summarize'"
    )


def test_impossible_number_names_the_bound():
    msg = error("placement: {pools: [{name: a, max_tokens: 512, cores_per_instance: 0}]}")
    assert msg == "my.yaml: placement.pools[0].cores_per_instance: must be >= 1; got 0"


def test_instances_takes_a_number_or_auto_only():
    msg = error("placement: {pools: [{name: a, max_tokens: 512, instances: many}]}")
    assert (
        msg
        == "my.yaml: placement.pools[0].instances: expected an integer or 'auto', got str 'many'"
    )


def test_missing_required_key_is_named():
    assert error("placement: {pools: [{name: a}]}") == (
        "my.yaml: placement.pools[0].max_tokens: required key is missing"
    )


def test_duplicate_pool_names_are_refused():
    assert "'a' is already the name of placement.pools[0]" in error(
        "placement: {pools: [{name: a, max_tokens: 32}, {name: a, max_tokens: 512}]}"
    )


def test_two_pools_with_one_length_band_are_refused():
    assert "each pool needs its own length band" in error(
        "placement: {pools: [{name: a, max_tokens: 512}, {name: b, max_tokens: 512}]}"
    )


def test_only_one_pool_may_be_auto():
    assert "only one pool may be 'auto'" in error(
        "placement: {pools: [{name: a, max_tokens: 32}, {name: b, max_tokens: 512}]}"
    )


def test_texts_longer_than_every_pool_are_caught_before_serving():
    msg = error("model: {max_length: 512}\nplacement: {pools: [{name: a, max_tokens: 128}]}")
    assert "texts of 129-512 tokens would have no pool" in msg


def test_an_empty_pool_list_is_refused_even_where_the_model_sets_the_length():
    # bundled:minilm declares max_seq_length 256, which is checked against the pools.
    assert error("placement: {pools: []}") == (
        "my.yaml: placement.pools: at least one pool is required"
    )


def test_pool_names_must_be_safe_to_print():
    assert "placement.pools[0].name: use 1-32 letters" in error(
        "placement: {pools: [{name: 'a b', max_tokens: 512}]}"
    )


def test_endpoint_must_be_a_zeromq_endpoint():
    assert "server.endpoint: expected a ZeroMQ endpoint" in error(
        "server: {endpoint: localhost:5555}"
    )


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1:0", "127.0.0.1:70000", "http://x:1"])
def test_metrics_must_be_host_and_port(address):
    assert "server.metrics: expected host:port" in error(f'server: {{metrics: "{address}"}}')


@pytest.mark.parametrize("address", ["0.0.0.0:9464", "[::1]:9100", "metrics.internal:80"])
def test_metrics_takes_any_host_and_port(address):
    assert parse_config(f'server: {{metrics: "{address}"}}').server.metrics == address


def test_an_empty_metrics_address_turns_the_endpoint_off_and_other_strings_stay_required():
    assert parse_config('server: {metrics: ""}').server.metrics == ""
    assert "expected a non-empty string" in error('model: {path: ""}')


def test_invalid_yaml_gives_the_line():
    msg = error("model:\n  path: [unclosed\n")
    assert msg.startswith("my.yaml: not valid YAML (line")


def test_a_list_where_a_mapping_belongs_is_named():
    assert error("model: [a, b]") == "my.yaml: model: expected a mapping, got a list"


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")


def test_the_core_types_a_pool_may_name_are_those_the_topology_reports():
    hint = typing.get_type_hints(PoolConfig)["core_types"]
    assert typing.get_args(typing.get_args(hint)[0]) == CORE_TYPES


MODELS = """
models:
  - name: toxicity
    task: classify
    max_length: 128
    pools: [{name: main, max_tokens: 128, instances: 2}]
  - name: embed
    weight: 3
    pools:
      - {name: short, max_tokens: 64}
      - {name: long, max_tokens: 512, cores_per_instance: 4, instances: 1}
placement: {reserved_cores: 1}
"""


def test_models_each_have_a_name_their_own_pools_and_a_weight():
    toxicity, embed = parse_config(MODELS).models
    assert (toxicity.name, toxicity.task, toxicity.max_length, toxicity.weight) == (
        "toxicity",
        "classify",
        128,
        1,
    )
    assert [p.name for p in toxicity.pools] == ["main"]
    assert (embed.name, embed.weight, [p.name for p in embed.pools]) == (
        "embed",
        3,
        ["short", "long"],
    )


def test_a_models_unset_max_length_is_its_own_checkpoints():
    embed = with_checkpoint_lengths(parse_config(MODELS)).models[1]
    assert embed.max_length == 256  # bundled:minilm's max_seq_length
    assert embed.model.max_length == 256


def test_a_model_config_is_one_model_named_default():
    config = parse_config(GOOD)
    (served,) = config.models
    assert served.name == "default" and served.weight == 1
    assert served.pools == config.placement.pools
    assert served.model == config.model
    assert not config.named  # requests name no model


def test_a_models_config_is_named():
    assert parse_config(MODELS).named


def test_the_one_model_takes_the_checkpoints_max_length_as_model_does(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a saved model's, as far as the config reads
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    config = with_checkpoint_lengths(
        parse_config(
            f"model: {{path: {tmp_path}}}\nplacement: {{pools: [{{name: main, max_tokens: 128}}]}}"
        )
    )
    (served,) = config.models
    assert served.max_length == config.model.max_length == 128  # not the default, 256


def test_an_empty_models_list_is_refused():
    with pytest.raises(ConfigError, match="models: at least one model is required"):
        parse_config("models: []")


def test_model_and_models_together_are_an_error():
    msg = error("model: {task: embed}\nmodels: [{name: a}]")
    assert msg.startswith("my.yaml: model: a config has `model:` (one model) or `models:`")


def test_placement_pools_with_models_are_an_error():
    msg = error("models: [{name: a}]\nplacement: {pools: [{name: x, max_tokens: 512}]}")
    assert msg.startswith("my.yaml: placement.pools: with `models:`, each model has its own pools")


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("models: []", "models: at least one model is required"),
        ("models: [{path: x}]", "models[0].name: required key is missing"),
        ("models: [{name: a}, {name: a}]", "models[1].name: 'a' is already the name of models[0]"),
        ("models: [{name: a.b}]", "models[0].name: use 1-32 letters, digits, '-' or '_'"),
        ("models: [{name: a, weight: 0}]", "models[0].weight: must be >= 1; got 0"),
        (
            "models: [{name: a, max_length: 128, pools: [{name: x, max_tokens: 64}]}]",
            "models[0].pools: the largest max_tokens is 64 but models[0].max_length is 128",
        ),
        (
            "models: [{name: a, max_length: 64, pools: []}]",
            "models[0].pools: at least one pool is required",
        ),
        (
            "models: [{name: a, quantize: none, keep_fp32: [x]}]",
            "models[0].keep_fp32: names layers to leave out of int8, but models[0].quantize",
        ),
        (
            "models: [{name: a, keep_fp32: [x]}]",
            "models[0].keep_fp32: names layers to leave out of int8, which models[0].quantize: "
            "auto chooses by itself",
        ),
        (
            "models: [{name: a, backend: openvino, quantize: int16}]",
            "models[0].quantize: int16 is not offered by backend openvino, which runs int8 or "
            "bf16 or none; int16 runs on backend ctranslate2",
        ),
        (
            "models: [{name: a, backend: torch, quantize: bf16}]",
            "models[0].quantize: bf16 is not offered by backend torch, which runs int8 or none; "
            "bf16 runs on backend openvino",
        ),
    ],
)
def test_each_models_mistakes_name_its_key(yaml_text, expected):
    assert error(yaml_text).startswith(f"my.yaml: {expected}")


def test_a_checkpoints_max_length_beyond_the_models_pools_is_refused_as_it_loads():
    checked = parse_config("models: [{name: a, pools: [{name: x, max_tokens: 10}]}]", "my.yaml")
    with pytest.raises(ConfigError) as e:
        with_checkpoint_lengths(checked)
    assert str(e.value).startswith(
        "my.yaml: models[0].max_length is not set, so it is bundled:minilm's max_seq_length, 256"
    )


def test_an_http_body_limit_over_the_message_limit_is_refused_with_both_sizes():
    text = "server: {max_message_bytes: 1048576, http_max_body_bytes: 2097152}"
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="my.yaml")
    assert "server.http_max_body_bytes (2,097,152) is over server.max_message_bytes" in str(e.value)
    assert "(1,048,576)" in str(e.value)


def test_the_default_limits_take_2048_texts_of_4_kb():
    server = parse_config("").server
    assert server.max_texts == 2048 and server.http_max_body_bytes >= 2048 * 4096
    assert server.max_message_bytes >= server.http_max_body_bytes
