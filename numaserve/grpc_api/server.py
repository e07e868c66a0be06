"""grpcio's asyncio server on a front's loop, on server.grpc (shared with the other fronts:
grpcio sets SO_REUSEPORT), serving TEI's services (services.py) as TEI's proto declares each
method, the standard health service (grpc.health.v1: SERVING while some instance of every
model serves, and per service, as TEI sets it) and server reflection."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from numaserve.front.core import Core
from numaserve.front.errors import ApiError
from numaserve.front.stats import Stats
from numaserve.grpc_api.calls import Calls, parser
from numaserve.grpc_api.proto import PACKAGE, SERVICES, full_names, tei
from numaserve.grpc_api.services import Methods
from numaserve.processes.tracing import Tracing

log = logging.getLogger("numaserve.front")
HEALTH_EVERY_S = 1.0
# Each of TEI's methods: the Methods attribute that answers one message (a stream's answers
# each of its messages in order; RerankStream's takes the whole stream, for one answer).
ANSWERS = {
    "Info": "info",
    "Embed": "embed",
    "EmbedStream": "embed",
    "EmbedSparse": "embed_sparse",
    "EmbedSparseStream": "embed_sparse",
    "EmbedAll": "embed_all",
    "EmbedAllStream": "embed_all",
    "Predict": "predict",
    "PredictPair": "predict_pair",
    "PredictStream": "predict",
    "PredictPairStream": "predict_pair",
    "Rerank": "rerank",
    "RerankStream": "rerank_stream",
    "Tokenize": "tokenize",
    "TokenizeStream": "tokenize",
    "Decode": "decode",
    "DecodeStream": "decode",
}
# Which tasks each service serves, for its health (Info and Tokenize serve every model).
TASKS_OF = {"Embed": {"embed", "sparse"}, "Predict": {"classify"}, "Rerank": {"rerank"}}


class GrpcListenError(Exception):
    pass


class GrpcServer:
    def __init__(self, core: Core, stats: Stats, tracing: Tracing | None):
        self.core = core
        self.calls = Calls(core, stats, tracing)
        self.methods = Methods(core, self.calls)
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.watch: asyncio.Task | None = None

    async def start(self, address: str) -> None:
        max_bytes = self.core.spec.server.max_message_bytes
        self.server = grpc.aio.server(
            options=(
                ("grpc.max_receive_message_length", max_bytes),
                ("grpc.max_send_message_length", -1),
            )
        )
        for name in SERVICES:
            self.server.add_generic_rpc_handlers((self._handlers(name),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (*full_names(), health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        why = "the address is taken or not this host's"
        try:
            port = self.server.add_insecure_port(address)
        except RuntimeError as e:
            port, why = 0, str(e)
        if not port:
            raise GrpcListenError(f"cannot listen on {address} (server.grpc): {why}")
        await self.server.start()
        await self._set_health(False)
        self.watch = asyncio.ensure_future(self._watch_health())

    async def stop(self, grace_s: float) -> None:
        """No new call; those running get `grace_s` to finish."""
        if self.watch is not None:
            self.watch.cancel()
        if self.server is not None:
            await self.health.enter_graceful_shutdown()
            await self.server.stop(grace_s)

    def _handlers(self, service: str) -> grpc.GenericRpcHandler:
        pb, _ = tei()
        descriptor = pb.DESCRIPTOR.services_by_name[service]
        handlers = {}
        for method in descriptor.methods:
            name = f"/{PACKAGE}.{service}/{method.name}"
            answer = getattr(self.methods, ANSWERS[method.name])
            kinds = (method.client_streaming, method.server_streaming)
            make = {
                (False, False): grpc.unary_unary_rpc_method_handler,
                (True, True): grpc.stream_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler,
            }[kinds]
            handlers[method.name] = make(
                self._behaviour(name, answer, streams=all(kinds)),
                request_deserializer=parser(getattr(pb, method.input_type.name)),
                response_serializer=getattr(pb, method.output_type.name).SerializeToString,
            )
        return grpc.method_handlers_generic_handler(f"{PACKAGE}.{service}", handlers)

    def _behaviour(self, name: str, answer, streams: bool):
        calls = self.calls
        if streams:

            async def stream(requests, context):
                async for reply in calls.stream(name, requests, context, answer):
                    yield reply

            return stream

        async def unary(request, context):
            return await calls.unary(name, request, context, answer)

        return unary

    async def _watch_health(self) -> None:
        """Every HEALTH_EVERY_S, what the shards say: SERVING while some instance of every
        model serves (the service "" and each service of a task served)."""
        while True:
            await asyncio.sleep(HEALTH_EVERY_S)
            try:
                up = all([await self.core.serving(m) for m in self.core.models.values()])
            except ApiError:
                up = False
            await self._set_health(up)

    async def _set_health(self, up: bool) -> None:
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        tasks = {m.model.task for m in self.core.models.values()}
        await self.health.set("", serving if up else not_serving)
        for service in SERVICES:
            served = service not in TASKS_OF or bool(TASKS_OF[service] & tasks)
            # TEI: Info and Tokenize always serve; a task's service while its model does.
            status = serving if served and (up or service not in TASKS_OF) else not_serving
            await self.health.set(f"{PACKAGE}.{service}", status)
