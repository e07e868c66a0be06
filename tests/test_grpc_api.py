"""TEI's gRPC API (server.grpc) as a client generated from TEI's own proto calls it: a real
front process, serving gRPC only, in front of a real router shard in a thread with stand-in
workers (tests/harness/stand_in.py: each text's embedding is [0.5, 0.5, 0.5, 0.5]). The same
API against a real server and models: tests/test_grpc_server.py (slow)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from numaserve.config.schema import ConfigError, ModelConfig, parse_config
from numaserve.front.errors import FROM_CODE, ApiError
from numaserve.grpc_api.calls import in_order, status_of
from numaserve.grpc_api.proto import HERE
from numaserve.grpc_api.services import MODEL_TYPES
from numaserve.processes.specs import FrontModel, FrontSpec
from numaserve.tasks import TASKS
from numaserve.testing.ports import free_port
from numaserve.wire.protocol import ErrorCode
from tests.harness.stand_in import InProcessRouter
from tests.harness.waiting import eventually

KEY = "k" * 24


@pytest.fixture(scope="module")
def tei(tmp_path_factory):
    """(messages, stubs): TEI's proto compiled by protoc, as a TEI user generates a client."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("generated")
    assert (
        protoc.main(
            ["protoc", f"-I{HERE}", f"--python_out={out}", f"--grpc_python_out={out}", "tei.proto"]
        )
        == 0
    )
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")
    finally:
        sys.path.remove(str(out))


def start_front(router: InProcessRouter, tmp_path, **server) -> tuple[subprocess.Popen, str]:
    """A front process as the supervisor starts one, serving gRPC alone."""
    address = f"127.0.0.1:{free_port()}"
    model = FrontModel("default", ModelConfig(), (router.spec.local,))
    settings = dataclasses.replace(router.spec.server, http="", grpc=address, **server)
    spec = FrontSpec(models=(model,), named=False, server=settings)
    proc = subprocess.Popen(spec.argv())
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
    return proc, address


@pytest.fixture
def router(front_router):
    return front_router


@pytest.fixture
def channel(router, tmp_path):
    proc, address = start_front(router, tmp_path)
    with grpc.insecure_channel(address) as made:
        yield made
    proc.terminate()
    assert proc.wait(30) == 0


def test_embed_answers_the_vector_with_teis_metadata_and_timing_headers(router, channel, tei):
    pb, stubs = tei
    router.add_worker("main-0")
    reply, call = stubs.EmbedStub(channel).Embed.with_call(
        pb.EmbedRequest(inputs="hello world"), metadata=(("x-request-id", "req-7"),)
    )
    assert list(reply.embeddings) == [0.5] * 4  # a unit vector already
    assert reply.metadata.compute_chars == 11 and reply.metadata.compute_tokens == 4
    assert reply.metadata.total_time_ns > reply.metadata.queue_time_ns > 0
    headers = dict(call.initial_metadata())
    assert headers["x-request-id"] == "req-7" and headers["x-compute-tokens"] == "4"


def test_embed_cuts_to_dimensions_and_normalizes_unless_told_not_to(router, channel, tei):
    pb, stubs = tei
    router.add_worker("main-0")
    embed = stubs.EmbedStub(channel).Embed
    assert list(embed(pb.EmbedRequest(inputs="a", dimensions=2)).embeddings) == pytest.approx(
        [2**-0.5] * 2
    )
    assert list(embed(pb.EmbedRequest(inputs="a", normalize=False)).embeddings) == [0.5] * 4


def test_a_stream_answers_each_message_in_order(router, channel, tei):
    pb, stubs = tei
    router.add_worker("main-0")
    texts = [pb.EmbedRequest(inputs="x" * n) for n in range(1, 41)]
    replies = stubs.EmbedStub(channel).EmbedStream(iter(texts))
    assert [r.metadata.compute_chars for r in replies] == list(range(1, 41))


def test_an_empty_input_is_invalid_argument(router, channel, tei):
    pb, stubs = tei
    with pytest.raises(grpc.RpcError) as refused:
        stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs=""))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot be empty" in refused.value.details()


def test_a_call_while_no_instance_serves_is_unavailable(router, channel, tei):
    pb, stubs = tei
    with pytest.raises(grpc.RpcError) as refused:
        stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="hello"), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_service_for_another_task_is_failed_precondition_naming_both(router, channel, tei):
    pb, stubs = tei
    with pytest.raises(grpc.RpcError) as refused:
        stubs.PredictStub(channel).Predict(pb.PredictRequest(inputs="hello"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "model 'default' serves embed; Predict is for classify models"


def test_tokenize_and_decode_answer_with_the_models_tokenizer(channel, tei):
    pb, stubs = tei
    tokenize = stubs.TokenizeStub(channel)
    tokens = tokenize.Tokenize(pb.EncodeRequest(inputs="hello world", add_special_tokens=True))
    assert [(t.text, t.special) for t in tokens.tokens] == [
        ("[CLS]", True),
        ("hello", False),
        ("world", False),
        ("[SEP]", True),
    ]
    assert (tokens.tokens[2].start, tokens.tokens[2].stop) == (6, 11)
    assert not tokens.tokens[0].HasField("start")
    ids = [t.id for t in tokens.tokens]
    decoded = tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True))
    assert decoded.text == "hello world"


def test_info_says_the_model_and_limits_as_tei_does(channel, tei):
    pb, stubs = tei
    info = stubs.InfoStub(channel).Info(pb.InfoRequest())
    assert info.model_id == "bundled:minilm" and info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert info.max_client_batch_size == 2048 and info.max_input_length == 256


def test_health_is_serving_once_an_instance_serves(router, channel):
    health = health_pb2_grpc.HealthStub(channel)

    def status(service: str):
        return health.Check(health_pb2.HealthCheckRequest(service=service)).status

    assert status("tei.v1.Embed") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert status("tei.v1.Info") == health_pb2.HealthCheckResponse.SERVING
    router.add_worker("main-0")
    eventually(lambda: status("") == health_pb2.HealthCheckResponse.SERVING, timeout=10)
    assert status("tei.v1.Embed") == health_pb2.HealthCheckResponse.SERVING
    assert status("tei.v1.Predict") == health_pb2.HealthCheckResponse.NOT_SERVING  # not served


def test_reflection_lists_teis_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = stub.ServerReflectionInfo(iter([request]))
    names = {s.name for s in reply.list_services_response.service}
    assert {"tei.v1.Embed", "tei.v1.Rerank", "grpc.health.v1.Health"} <= names


def test_a_call_needs_a_listed_key_in_its_authorization_metadata(router, tmp_path, tei):
    pb, stubs = tei
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    router.add_worker("main-0")
    proc, address = start_front(router, tmp_path, http_api_keys_file=str(keys))
    try:
        with grpc.insecure_channel(address) as channel:
            embed = stubs.EmbedStub(channel).Embed
            with pytest.raises(grpc.RpcError) as refused:
                embed(pb.EmbedRequest(inputs="hello"))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            keyed = embed(
                pb.EmbedRequest(inputs="hello"), metadata=(("authorization", f"Bearer {KEY}"),)
            )
            assert list(keyed.embeddings) == [0.5] * 4
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_client_that_leaves_mid_stream_leaves_nothing_running(tmp_path, tei):
    pb, stubs = tei
    # A micro-batch takes 0.5 s: the stream's window of 64 texts would keep the one
    # instance busy for 4 s more if its texts were not cancelled at the shard.
    slow = InProcessRouter(tmp_path, delay=0.5, local=f"ipc://{tmp_path}/local.sock")
    proc, address = start_front(slow, tmp_path)
    try:
        with grpc.insecure_channel(address) as channel:
            texts = (pb.EmbedRequest(inputs=f"text {i}") for i in range(1000))
            replies = stubs.EmbedStub(channel).EmbedStream(texts)
            next(replies)
            replies.cancel()
            (worker,) = slow.workers
            time.sleep(1.2)  # the micro-batch the instance holds ends
            ran = worker.inputs
            time.sleep(1.2)
            assert worker.inputs == ran <= 3 * 8
            after = stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="after"))
            assert after.metadata.compute_chars == 5
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        slow.close()


def test_sigterm_answers_the_calls_a_front_holds_then_it_exits(tmp_path, tei):
    pb, stubs = tei
    slow = InProcessRouter(tmp_path, delay=1.0, local=f"ipc://{tmp_path}/local.sock")
    proc, address = start_front(slow, tmp_path)
    try:
        with grpc.insecure_channel(address) as channel:
            future = stubs.EmbedStub(channel).Embed.future(pb.EmbedRequest(inputs="held"))
            time.sleep(0.3)  # at the instance now
            proc.send_signal(signal.SIGTERM)
            assert len(future.result(timeout=30).embeddings) == 4
            assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        slow.close()


# -- the parts, alone ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.BAD_REQUEST, grpc.StatusCode.INVALID_ARGUMENT),
        (ErrorCode.TOO_LONG, grpc.StatusCode.INVALID_ARGUMENT),
        (ErrorCode.OVERLOADED, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ErrorCode.NO_INSTANCE, grpc.StatusCode.UNAVAILABLE),
        (ErrorCode.INTERNAL, grpc.StatusCode.FAILED_PRECONDITION),
        (ErrorCode.DEADLINE_EXCEEDED, grpc.StatusCode.DEADLINE_EXCEEDED),
    ],
)
def test_each_protocol_error_is_the_status_code_tei_gives_it(code, status):
    http_status, kind = FROM_CODE[code.value]
    assert status_of(ApiError(http_status, "why", kind)) == status


def test_a_front_refusal_of_its_own_has_its_own_code():
    assert status_of(ApiError(401, "no key")) == grpc.StatusCode.UNAUTHENTICATED
    assert status_of(ApiError(404, "no model")) == grpc.StatusCode.NOT_FOUND
    assert status_of(ApiError(413, "too many")) == grpc.StatusCode.INVALID_ARGUMENT


def test_in_order_answers_in_the_order_asked_however_they_finish():
    async def main():
        async def requests():
            for delay in (0.05, 0.0, 0.02):
                yield delay

        async def answer(delay):
            await asyncio.sleep(delay)
            return delay

        return [a async for a in in_order(requests(), answer)]

    assert asyncio.run(main()) == [0.05, 0.0, 0.02]


def test_in_order_reads_no_further_than_its_window_ahead():
    read = []

    async def main():
        async def requests():
            for i in range(100):
                read.append(i)
                yield i

        gate = asyncio.Event()

        async def answer(i):
            await gate.wait()
            return i

        answers = in_order(requests(), answer, window=4)
        first = asyncio.ensure_future(answers.__anext__())
        await asyncio.sleep(0.05)
        ahead = len(read)
        gate.set()
        await first
        await answers.aclose()
        return ahead

    assert asyncio.run(main()) <= 4 + 2  # the window, one waiting to go in, one being read


# -- config --------------------------------------------------------------------------------


def test_a_grpc_address_other_hosts_reach_needs_keys_or_insecure():
    with pytest.raises(ConfigError, match=r"server\.grpc: 0\.0\.0\.0:8081 can be reached"):
        parse_config('server: {grpc: "0.0.0.0:8081"}')
    keyed = parse_config('server: {grpc: "0.0.0.0:8081", http_api_keys_file: /etc/keys}')
    assert keyed.server.grpc == "0.0.0.0:8081"


def test_a_grpc_address_that_is_not_host_port_is_refused_naming_an_example():
    with pytest.raises(ConfigError, match=r"server.grpc: expected host:port, like 127.0.0.1:8081"):
        parse_config('server: {grpc: "grpc://localhost:8081"}')


def test_grpc_on_the_http_apis_own_address_is_refused():
    with pytest.raises(ConfigError, match=r"server.http and server.grpc are both 127.0.0.1:8080"):
        parse_config('server: {grpc: "127.0.0.1:8080"}')


def test_a_truncation_direction_tei_has_not_is_invalid_argument(router, channel, tei):
    pb, stubs = tei
    router.add_worker("main-0")
    request = pb.EmbedRequest(inputs="hello", truncation_direction=7)  # an enum from elsewhere
    with pytest.raises(grpc.RpcError) as refused:
        stubs.EmbedStub(channel).Embed(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "truncation_direction 7" in refused.value.details()


def test_a_message_that_is_not_teis_is_refused_and_the_front_serves_on(router, channel, tei):
    pb, stubs = tei
    router.add_worker("main-0")
    garbage = channel.unary_unary(
        "/tei.v1.Embed/Embed", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.RpcError) as refused:
        garbage(b"\xff\xff\xff\xff not a protobuf")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("not a tei.v1.EmbedRequest")
    assert len(stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="after")).embeddings) == 4


def test_start_refuses_the_grpc_api_where_grpcio_is_not_installed(monkeypatch):
    from numaserve.monitoring.endpoint import MonitoringError
    from numaserve.supervisor import start

    # The installation faked: one of the modules the check looks for made absent.
    monkeypatch.setattr(start, "GRPC_MODULES", ("grpc", "grpc_missing_here"))
    config = parse_config(f'server: {{grpc: "127.0.0.1:{free_port()}"}}')
    with pytest.raises(
        MonitoringError, match=r"server.grpc: TEI's gRPC API needs grpc_missing_here"
    ):
        start.check_front_ports(config)
    start.check_front_ports(parse_config('server: {grpc: "", http: ""}'))  # off: none needed


def test_every_task_has_the_tei_model_type_info_names():
    assert set(MODEL_TYPES) == set(TASKS)
