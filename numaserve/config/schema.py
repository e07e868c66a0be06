"""The YAML configuration, parsed into frozen dataclasses and validated key by key.

Every field's type hint is its schema; `metadata` adds bounds. An error names the file and the
dotted key (`placement.pools[1].cores_per_instance`) so the fix is obvious from one line.
Every key is documented in docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, Union

import yaml

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import checkpoint_max_length
from numaserve.config.addresses import is_local, split_host_port
from numaserve.config.files import read_against
from numaserve.config.runtimes import precision_problem
from numaserve.tasks import NAMES
from numaserve.tasks.base import MAX_WINDOWS
from numaserve.wire.protocol import SMALLEST_MESSAGE_LIMIT

AUTO = "auto"
DEFAULT_MODEL = "default"  # the name of the one model of a `model:` config
NAME = r"[A-Za-z0-9_-]{1,32}"  # a model's or a pool's name
MAX_LENGTH = 8192  # the most tokens model.max_length may be
MAX_TEXTS = 100_000  # the most texts server.max_texts may be
# model.max_paths' default: MiniLM's instance holds 72 MB PSS on one path, 155 on two, 307
# on three (OpenVINO's runtime beside CTranslate2: docs/benchmarks.md#what-an-instance-holds).
MAX_PATHS = 3


class ConfigError(ValueError):
    pass


M = TypeVar("M", bound="ModelConfig")


def _bounds(lo: int | float | None = None, hi: int | float | None = None) -> dict:
    return {"min": lo, "max": hi}


Backend = Literal["auto", "torch", "onnxruntime", "openvino", "ctranslate2"]  # model.backend
Quantize = Literal["auto", "int8", "int16", "bf16", "none"]  # model.quantize


@dataclass(frozen=True)
class ModelConfig:
    # A directory (relative: to the config file's), `bundled:minilm`, or a hub id (its cache).
    path: str = "bundled:minilm"
    # rerank: a cross-encoder's score for each (query, document) pair. ner: a token
    # classifier's entities.
    task: Literal[NAMES] = "embed"  # numaserve/tasks
    # auto (both): each pool's fastest path that passes the accuracy gate (backends/choice.py).
    # onnxruntime: an ONNX artifact (backends/onnx_build.py); openvino: that artifact compiled
    # by OpenVINO; ctranslate2: the encoder converted by CTranslate2 (backends/ct2_build.py).
    backend: Backend = "auto"
    quantize: Quantize = "auto"  # config/runtimes.py
    # With int8: the Linear layers left in fp32, as globs over module paths (backends/precision.py).
    keep_fp32: tuple[str, ...] = ()
    # dynamic: pad only to the longest text in a forward pass; max_length: always pad to max_length.
    padding: Literal["dynamic", "max_length"] = "dynamic"
    # Not set: the checkpoint's max_seq_length (sentence_bert_config.json), else 256.
    max_length: int = field(default=256, metadata=_bounds(1, MAX_LENGTH))
    # true: longer texts are cut to max_length and the reply says so; false: they are refused.
    truncate: bool = True
    # rerank: a document longer than max_length is scored in up to this many overlapping
    # windows, the query in each, and scores its best window's score; 1: it is cut instead.
    # A request may ask for another number (max_chunks_per_doc).
    max_chunks_per_doc: int = field(default=8, metadata=_bounds(1, MAX_WINDOWS))
    # quantize: auto: the most model paths an instance of a pool holds. The paths each band
    # of lengths needs to be accurate are held whatever this says; a band's throughput path
    # (its micro-batches', where another is faster there) only within it.
    max_paths: int = field(default=MAX_PATHS, metadata=_bounds(1, 8))


@dataclass(frozen=True)
class CurveConfig:
    # The server's key pair: NAME.key_secret from `numaserve keygen`, not readable by others.
    secret_key_file: str
    # The clients' public keys (NAME.key files); one added or removed applies to the next
    # connection, with no restart.
    authorized_keys_dir: str


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces (docs/monitoring.md). Each key given sets its `OTEL_*` variable
    (named beside it) for every process of the server, over the environment's; a key left out
    leaves the environment's. Tracing is on where an endpoint is named, here or there."""

    # OTEL_EXPORTER_OTLP_ENDPOINT: the collector's base URL (http://HOST:4318 for OTLP over
    # HTTP, to which /v1/traces is added; http://HOST:4317 for gRPC)
    endpoint: str | None = None
    protocol: Literal["http/protobuf", "grpc"] | None = None  # OTEL_EXPORTER_OTLP_PROTOCOL
    headers: str | None = None  # OTEL_EXPORTER_OTLP_HEADERS: `key=value,key2=value2` (auth)
    sampler: str | None = None  # OTEL_TRACES_SAMPLER: parentbased_traceidratio, always_off, ...
    sampler_arg: str | None = None  # OTEL_TRACES_SAMPLER_ARG: the ratio, as `0.01`
    service_name: str | None = None  # OTEL_SERVICE_NAME (numaserve where neither says one)
    resource_attributes: str | None = None  # OTEL_RESOURCE_ATTRIBUTES: `key=value,...`


@dataclass(frozen=True)
class ServerConfig:
    endpoint: str = "tcp://127.0.0.1:5555"
    cache_entries: int = field(default=100_000, metadata=_bounds(0))
    # Texts waiting per pool; past this, requests are answered `overloaded` at once.
    queue_size: int = field(default=256, metadata=_bounds(1))
    # A text queued this long without reaching an instance is answered `overloaded`: a
    # request with no deadline_ms still gets an answer in bounded time.
    max_queue_ms: int = field(default=2000, metadata=_bounds(1, 3_600_000))
    # A text may run on a larger pool's idle instance when its own pool has none idle.
    spillover: bool = True
    # Micro-batching: up to max_batch queued texts of one pool share a forward pass, of at
    # most max_batch_tokens (texts x the longest); a lone text waits up to max_wait_ms for
    # company. With nothing queued a text runs alone at once: no cost at low load. 1 turns it
    # off. Why these defaults: docs/configuration.md#micro-batching.
    max_batch: int = field(default=8, metadata=_bounds(1, 256))
    max_batch_tokens: int = field(default=128, metadata=_bounds(1))
    max_wait_ms: int = field(default=0, metadata=_bounds(0, 1000))
    # Texts in one request. A request of more than a few micro-batches is queued a piece at
    # a time and spread over every instance (docs/configuration.md#big-requests).
    max_texts: int = field(default=2048, metadata=_bounds(1, MAX_TEXTS))
    max_message_bytes: int = field(default=16 << 20, metadata=_bounds(SMALLEST_MESSAGE_LIMIT))
    heartbeat_ms: int = field(default=500, metadata=_bounds(10, 60_000))
    heartbeat_liveness: int = field(default=3, metadata=_bounds(1, 100))
    # Router shards: auto is one per NUMA node that holds instances, behind one endpoint.
    routers: int | Literal["auto"] = field(default=AUTO, metadata=_bounds(1, 64))
    # host:port of the HTTP endpoint for Prometheus (/metrics) and probes (/healthz, /readyz);
    # "" turns it off.
    metrics: str = field(default="127.0.0.1:9464", metadata={"empty": True})
    # CurveZMQ on `endpoint`: only clients holding an authorised key get in (docs/deployment.md).
    curve: CurveConfig | None = None
    # true: let a tcp endpoint or the HTTP API serve anyone beyond loopback, in plaintext.
    insecure: bool = False
    # The HTTP API (docs/http.md), host:port; "" turns it off. Each key: docs/configuration.md.
    http: str = field(default="127.0.0.1:8080", metadata={"empty": True})
    http_api_keys_file: str | None = None  # one key per line; re-read when it changes
    http_processes: int | Literal["auto"] = field(default=AUTO, metadata=_bounds(1, 64))
    http_max_body_bytes: int = field(default=8 << 20, metadata=_bounds(1024, 1 << 30))  # 413
    http_read_timeout_s: float = field(default=30.0, metadata=_bounds(0.1, 3600))  # 408
    # TEI's gRPC API (docs/grpc.md), host:port; "" (the default) turns it off. It is served
    # by the same front processes as the HTTP API, with the same API keys.
    grpc: str = field(default="", metadata={"empty": True})
    # With `models:`: the model a call that names none gets, on the APIs whose requests have
    # no model field (TEI's routes, its gRPC API); "": such a call must name one.
    default_model: str = field(default="", metadata={"empty": True})
    tracing: TracingConfig = TracingConfig()  # OpenTelemetry: off unless an endpoint is named
    # An HTTP request slower than this is logged by its front, with where its time went (0: none)
    slow_request_ms: int = field(default=0, metadata=_bounds(0, 3_600_000))


@dataclass(frozen=True)
class PoolConfig:
    name: str
    max_tokens: int = field(metadata=_bounds(1))
    cores_per_instance: int = field(default=1, metadata=_bounds(1))
    instances: int | Literal["auto"] = field(default=AUTO, metadata=_bounds(1))
    # On a hybrid CPU, the core types an instance may take, in order of preference; one
    # instance never mixes types. Empty: every type, fastest first.
    core_types: tuple[Literal["performance", "mid", "efficiency"], ...] = ()


DEFAULT_POOLS = (PoolConfig(name="default", max_tokens=512),)


@dataclass(frozen=True)
class PlacementConfig:
    reserved_cores: int = field(default=0, metadata=_bounds(0))
    smt: bool = False
    # The pools of the one model of a `model:` config; with `models:`, each has its own.
    pools: tuple[PoolConfig, ...] = DEFAULT_POOLS


@dataclass(frozen=True, kw_only=True)
class ServedModel(ModelConfig):
    """One of several models a server serves (`models:`), or its only one (`model:`, named
    `default`): the model, its pools, and its share of the `auto` cores."""

    name: str
    pools: tuple[PoolConfig, ...] = DEFAULT_POOLS
    # The `auto` pools of all models share the cores the fixed pools leave, in proportion.
    weight: int = field(default=1, metadata=_bounds(1, 1000))

    @property
    def model(self) -> ModelConfig:
        """The model alone, as a worker and a router take it."""
        return ModelConfig(**_model_fields(self))


@dataclass(frozen=True)
class SupervisorConfig:
    # SIGTERM: requests in flight get this long to finish before the server stops anyway.
    drain_timeout_s: float = field(default=30.0, metadata=_bounds(0, 3600))
    # An instance not READY this long after its start is killed and restarted.
    start_timeout_s: float = field(default=180.0, metadata=_bounds(1, 3600))
    # After SIGTERM, a process still alive this long later gets SIGKILL.
    kill_timeout_s: float = field(default=10.0, metadata=_bounds(0.1, 600))
    # Quick exits in a row after which an instance is FATAL (never restarted). An exit is
    # quick unless the instance had been READY for stable_s (supervisord's startsecs):
    # a worker that crashes right after READY backs off, then stops being restarted.
    max_quick_exits: int = field(default=3, metadata=_bounds(1, 100))
    stable_s: float = field(default=5.0, metadata=_bounds(0, 3600))
    backoff_initial_s: float = field(default=0.5, metadata=_bounds(0, 600))
    backoff_max_s: float = field(default=30.0, metadata=_bounds(0, 3600))


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


@dataclass(frozen=True)
class Config:
    """One shape whichever form a file was written in: `models` holds every model served,
    a `model:` config's one as the model named `default` with `placement.pools` for its pools;
    `named` says whether requests name their model. Outside this module, only those two are
    read: never `model` nor `placement.pools`."""

    model: ModelConfig = ModelConfig()
    # Several models side by side, each with its own pools; instead of `model`.
    models: tuple[ServedModel, ...] = ()
    server: ServerConfig = ServerConfig()
    placement: PlacementConfig = PlacementConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    logging: LoggingConfig = LoggingConfig()
    source: str = field(default="<defaults>", metadata={"internal": True})
    # Requests name their model, and its instances' names carry it (a `models:` config). A
    # `model:` config's one model is asked for by no name, and a reload restarts every
    # instance of it, so that new weights at the same path load too.
    named: bool = field(default=False, metadata={"internal": True})
    # The models whose max_length the file leaves to their checkpoint, by index in `models`:
    # parse_config reads no model, and with_checkpoint_lengths fills them in.
    unset_max_length: tuple[int, ...] = field(default=(), metadata={"internal": True})

    def __post_init__(self) -> None:
        if not self.models:  # the one model of a `model:` config
            served = ServedModel(
                name=DEFAULT_MODEL, pools=self.placement.pools, **_model_fields(self.model)
            )
            object.__setattr__(self, "models", (served,))


def _model_fields(model: ModelConfig) -> dict:
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelConfig)}


def load_config(path: str | Path) -> Config:
    """A config file, to run: checked (parse_config), then each max_length it leaves unset
    read from its model's checkpoint (with_checkpoint_lengths)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from None
    return with_checkpoint_lengths(
        parse_config(text, source=str(path), base=path.absolute().parent)
    )


def parse_config(text: str, source: str = "<string>", base: Path | None = None) -> Config:
    """A config's text, checked key by key and across keys, reading no file but itself: a
    model's max_length the text leaves unset is its checkpoint's, which only
    with_checkpoint_lengths reads (and checks against its pools); until then it is the
    default, and `unset_max_length` names it."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source}: not valid YAML{at}: {problem}") from None
    if data is None:
        data = {}
    config = from_mapping(Config, data, source, "")
    named = isinstance(data, dict) and "models" in data
    config = read_against(dataclasses.replace(config, source=source), base, named)
    if named:
        _check_models_form(config, data, source)
        unset = tuple(i for i, given in enumerate(data["models"]) if "max_length" not in given)
        config = dataclasses.replace(config, named=True, unset_max_length=unset)
    elif "max_length" not in (data.get("model") or {}):
        config = dataclasses.replace(config, unset_max_length=(0,))
    _check_server(config, source)
    _check_default_model(config, source)
    for i, served in enumerate(config.models):
        where, pools_key = _model_keys(config, i)
        _check_model(served, served.pools, where, pools_key, source)
        if i not in config.unset_max_length:
            check_lengths(served, served.pools, where, pools_key, source, None)
    return config


def with_checkpoint_lengths(config: Config) -> Config:
    """`config` with each max_length it leaves unset read from its model's checkpoint (its
    sentence-transformers config's max_seq_length, as its own `encode` cuts; else the
    default), and checked against the model's pools: the one step of loading a config that
    reads the model."""
    if not config.unset_max_length:
        return config
    source = config.source
    models = list(config.models)
    for i in config.unset_max_length:
        where, pools_key = _model_keys(config, i)
        served, declared = _with_checkpoint_max_length(models[i], models[i].pools, where, source)
        check_lengths(served, served.pools, where, pools_key, source, declared)
        models[i] = served
    if config.named:
        return dataclasses.replace(config, models=tuple(models), unset_max_length=())
    (served,) = models  # the one model of a `model:` config: its `model`, and models anew
    return dataclasses.replace(config, model=served.model, models=(), unset_max_length=())


def _model_keys(config: Config, i: int) -> tuple[str, str]:
    """A model's key in the file and its pools' (`models[1]`, `models[1].pools`; the one
    model of a `model:` config: `model`, `placement.pools`)."""
    if config.named:
        return f"models[{i}]", f"models[{i}].pools"
    return "model", "placement.pools"


def _check_models_form(config: Config, data: dict, source: str) -> None:
    """`models:` replaces `model:` and `placement.pools`, and names each model once."""
    if "model" in data:
        raise ConfigError(
            f"{source}: model: a config has `model:` (one model) or `models:` (several), not "
            "both; move this model into the `models:` list with a name"
        )
    if "pools" in (data.get("placement") or {}):
        raise ConfigError(
            f"{source}: placement.pools: with `models:`, each model has its own pools "
            "(models[].pools); placement keeps reserved_cores and smt only"
        )
    if not data["models"]:  # config.models would hold the default model
        raise ConfigError(f"{source}: models: at least one model is required")
    names = [m.name for m in config.models]
    _check_names(names, "models", "requests name it, and it names instances", source)


def _check_names(names: list[str], key: str, why: str, source: str) -> None:
    """Each of the names at `key`[i].name is a valid name, and its own."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if not re.fullmatch(NAME, name):
            raise ConfigError(
                f"{source}: {key}[{i}].name: use 1-32 letters, digits, '-' or '_' ({why}); "
                f"got {name!r}"
            )
        if name in seen:
            raise ConfigError(
                f"{source}: {key}[{i}].name: {name!r} is already the name of {key}[{seen[name]}]"
            )
        seen[name] = i


def _with_checkpoint_max_length(
    model: M, pools: tuple[PoolConfig, ...], where: str, source: str
) -> tuple[M, str | None]:
    """`where`.max_length, when the config does not set it, is what the checkpoint's
    sentence-transformers config says it takes (as its own `encode` cuts), else 256; and,
    where it came from the checkpoint, the words that say so in an error."""
    try:
        found = checkpoint_max_length(model.path, model.task)
    except ModelLoadError as e:
        raise ConfigError(f"{source}: {where}.max_length is not set, and {e}") from None
    if found is None:
        return model, None
    length, key, file = found
    declared = f"{where}.max_length is not set, so it is {model.path}'s {key}, {length} ({file})"
    if length > MAX_LENGTH:
        longest = max((p.max_tokens for p in pools), default=MAX_LENGTH)
        raise ConfigError(
            f"{source}: {declared}, but numaserve takes at most {MAX_LENGTH}; set "
            f"{where}.max_length (at most {min(MAX_LENGTH, longest)}), or raise a pool's "
            "max_tokens"
        )
    return dataclasses.replace(model, max_length=length), declared


def from_mapping(cls: type, data: object, source: str, where: str = ""):
    """Build dataclass `cls` from parsed YAML/JSON, checking every key against its type hint."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: {where or 'top level'}: expected a mapping, got {_kind(data)}"
        )
    hints = typing.get_type_hints(cls)
    public = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    mistakes = [
        f"{source}: {_join(where, str(key))}: unknown key (known keys: {', '.join(public)})"
        for key in data
        if key not in public
    ]
    values = {}
    for name, f in public.items():
        key = _join(where, name)
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                mistakes.append(f"{source}: {key}: required key is missing")
            continue
        try:
            values[name] = _convert(hints[name], data[name], source, key, f.metadata)
        except ConfigError as e:  # every mistake is named at once, not one a run
            mistakes.extend(_mistakes(e))
    if mistakes:
        raise ConfigError(_said(mistakes, source) if not where else "\n".join(mistakes))
    return cls(**values)


def _mistakes(error: ConfigError) -> list[str]:
    """The mistakes one ConfigError names, a line each (its heading left out)."""
    lines = str(error).splitlines()
    return lines[1:] if len(lines) > 1 and lines[0].endswith(" mistakes:") else lines


def _said(mistakes: list[str], source: str) -> str:
    """One mistake as it is; several under a heading that counts them, a line each."""
    if len(mistakes) == 1:
        return mistakes[0]
    return "\n".join((f"{source}: {len(mistakes)} mistakes:", *mistakes))


def _convert(hint, value, source: str, key: str, meta):
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, source, key)
    if isinstance(hint, type) and hasattr(hint, "from_plain"):  # a value with a wire form
        try:
            return hint.from_plain(value)
        except ValueError as e:
            raise ConfigError(f"{source}: {key}: {e}") from None
    if origin is tuple:  # tuple[X, ...]: a YAML list
        (item, _) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}: expected a list, got {_kind(value)}")
        return tuple(_convert(item, v, source, f"{key}[{i}]", {}) for i, v in enumerate(value))
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            allowed = ", ".join(str(c) for c in choices)
            raise ConfigError(f"{source}: {key}: must be one of {allowed}; got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        return _convert_union(hint, value, source, key, meta)
    return _convert_scalar(hint, value, source, key, meta)


def _convert_union(hint, value, source: str, key: str, meta):
    """A type or named words, as in `int | Literal["auto"]`, or an optional one."""
    args = typing.get_args(hint)
    if type(None) in args:  # `X | None`: a spec's field that may be absent
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _convert(hint, value, source, key, meta)
    words = [c for a in args if typing.get_origin(a) is Literal for c in typing.get_args(a)]
    if value in words and not isinstance(value, bool):
        return value
    (other,) = [a for a in args if typing.get_origin(a) is not Literal]
    if isinstance(value, bool) or not isinstance(value, other):
        choices = " or ".join([_type_word(other)] + [repr(w) for w in words])
        raise ConfigError(f"{source}: {key}: expected {choices}, got {_kind(value)}")
    return _convert(other, value, source, key, meta)


def _convert_scalar(hint, value, source: str, key: str, meta):
    """bool, int, float (within the field's min and max) and str."""
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key}: expected true or false, got {_kind(value)}")
        return value
    if hint in (int, float):
        accepted = int if hint is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ConfigError(f"{source}: {key}: expected {_type_word(hint)}, got {_kind(value)}")
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo:
            raise ConfigError(f"{source}: {key}: must be >= {lo}; got {value}")
        if hi is not None and value > hi:
            raise ConfigError(f"{source}: {key}: must be <= {hi}; got {value}")
        return hint(value)
    if hint is str:
        if meta.get("empty") and value == "":
            return value
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{source}: {key}: expected a non-empty string, got {_kind(value)}")
        return value
    raise TypeError(f"config schema: unsupported type {hint!r} at {key}")  # a bug in this module


def _check_server(config: Config, source: str) -> None:
    """The server section's rules that no field's type can say."""
    if not re.fullmatch(r"(tcp|ipc)://\S+", config.server.endpoint):
        raise ConfigError(
            f"{source}: server.endpoint: expected a ZeroMQ endpoint like tcp://127.0.0.1:5555 "
            f"or ipc:///run/numaserve.sock; got {config.server.endpoint!r}"
        )
    server = config.server
    if not (server.curve or server.insecure or is_local(server.endpoint)):
        raise ConfigError(
            f"{source}: server.endpoint: {server.endpoint} can be reached from other hosts, in "
            "plaintext and by anyone; set server.curve (keys from `numaserve keygen`, "
            "docs/deployment.md), or server.insecure: true where a firewall or a private "
            "network already keeps others out"
        )
    addresses = (
        ("metrics", "127.0.0.1:9464"),
        ("http", "127.0.0.1:8080"),
        ("grpc", "127.0.0.1:8081"),
    )
    for key, example in addresses:
        address = getattr(server, key)
        if address and (split_host_port(address) or ("", 0))[1] == 0:
            raise ConfigError(
                f"{source}: server.{key}: expected host:port, like {example} or [::1]:"
                f'{example.rpartition(":")[2]}, or "" to turn it off; got {address!r}'
            )
    for key in ("http", "grpc"):
        address = getattr(server, key)
        if address and not (
            server.http_api_keys_file or server.insecure or is_local(f"tcp://{address}")
        ):
            raise ConfigError(
                f"{source}: server.{key}: {address} can be reached from other hosts, by anyone; "
                "set server.http_api_keys_file (docs/http.md#api-keys), or server.insecure: "
                "true where a firewall, a private network or a proxy in front already keeps "
                "others out"
            )
    if server.http and server.http == server.grpc:
        raise ConfigError(
            f"{source}: server.http and server.grpc are both {server.http}: give each its own port"
        )
    if server.http and server.http_max_body_bytes > server.max_message_bytes:
        raise ConfigError(
            f"{source}: server.http_max_body_bytes ({server.http_max_body_bytes:,}) is over "
            f"server.max_message_bytes ({server.max_message_bytes:,}): the HTTP front sends "
            "each body on to a router shard as one message of about its size; raise "
            "max_message_bytes or lower the body limit"
        )


def _check_default_model(config: Config, source: str) -> None:
    default = config.server.default_model
    names = [m.name for m in config.models]
    if default and not config.named:
        raise ConfigError(
            f"{source}: server.default_model is for a `models:` config; a `model:` config "
            "serves one model, which every call gets"
        )
    if default and default not in names:
        raise ConfigError(
            f"{source}: server.default_model: {default} is not one of the models "
            f"({', '.join(names)})"
        )


def _check_model(
    model: ModelConfig,
    pools: tuple[PoolConfig, ...],
    where: str,
    pools_key: str,
    source: str,
) -> None:
    """One model's rules across its keys and its pools: `where` is its key (`model`,
    `models[1]`), `pools_key` its pools' (`placement.pools`, `models[1].pools`)."""
    if problem := precision_problem(model.backend, model.quantize, model.keep_fp32, where):
        raise ConfigError(f"{source}: {problem}")
    if not pools:
        raise ConfigError(f"{source}: {pools_key}: at least one pool is required")
    _check_names([p.name for p in pools], pools_key, "it names instances and log lines", source)
    by_limit: dict[int, int] = {}
    for i, pool in enumerate(pools):
        if pool.max_tokens in by_limit:
            raise ConfigError(
                f"{source}: {pools_key}[{i}].max_tokens: {pool.max_tokens} is also the limit "
                f"of {pools_key}[{by_limit[pool.max_tokens]}]; each pool needs its own length "
                "band"
            )
        by_limit[pool.max_tokens] = i
    autos = [i for i, p in enumerate(pools) if p.instances == AUTO]
    if len(autos) > 1:
        raise ConfigError(
            f"{source}: {pools_key}[{autos[1]}].instances: only one pool may be 'auto' "
            f"({pools_key}[{autos[0]}] already is); give the others a number"
        )


def check_lengths(
    model: ModelConfig,
    pools: tuple[PoolConfig, ...],
    where: str,
    pools_key: str,
    source: str,
    declared: str | None,
) -> None:
    """Every length up to the model's max_length has a pool. `declared`: where max_length
    came from, when the checkpoint set it (_with_checkpoint_max_length)."""
    longest = max(p.max_tokens for p in pools)
    if longest < model.max_length and declared:
        raise ConfigError(
            f"{source}: {declared}, but the largest pool's max_tokens is {longest}; set "
            f"{where}.max_length (at most {longest}), or raise a pool's max_tokens"
        )
    if longest < model.max_length:
        raise ConfigError(
            f"{source}: {pools_key}: the largest max_tokens is {longest} but "
            f"{where}.max_length is {model.max_length}, so texts of {longest + 1}-"
            f"{model.max_length} tokens would have no pool; raise a pool's max_tokens "
            f"or lower {where}.max_length"
        )


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_word(hint) -> str:
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return words.get(hint, str(hint))


def _kind(value) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
