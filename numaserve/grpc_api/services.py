"""TEI's gRPC services on the front's core: each method reads its message into texts and
options as TEI's HTTP routes would take them, runs them (Core.run), and writes TEI's reply,
with TEI's `Metadata` (characters, tokens and where the time went, in nanoseconds).

As in TEI, a message's `truncate` is false unless set: a text over the model's max_length
is INVALID_ARGUMENT, not cut."""

from __future__ import annotations

import asyncio
import time

from numaserve.checkpoint.paths import resolve_model_path
from numaserve.front import facts, inputs
from numaserve.front.core import Core
from numaserve.front.errors import ApiError
from numaserve.grpc_api.calls import Calls, GrpcExchange, checked
from numaserve.grpc_api.proto import tei
from numaserve.processes.specs import FrontModel
from numaserve.tasks import serves
from numaserve.tasks.embed import EMBED
from numaserve.tasks.multivector import MULTIVECTOR
from numaserve.tasks.prompts import PromptError, Prompts
from numaserve.tasks.sparse import weights

# TEI's ModelType of each task: embedding, classifier, reranker
MODEL_TYPES = {"embed": 0, "sparse": 0, "multivector": 0, "classify": 1, "ner": 1, "rerank": 2}
DIRECTIONS = ("right", "left")  # TEI's TruncationDirection, by its number


class Methods:
    """What each of TEI's methods does with its message, on one front's core."""

    def __init__(self, core: Core, calls: Calls):
        self.core, self.calls = core, calls
        self.pb, _ = tei()

    def model(self, call: GrpcExchange, task: str | None, service: str) -> FrontModel:
        """The model the call names (its `model` metadata), or the only one; one of `task`
        where the service runs one."""
        model = self.core.model(call.model, "the `model` metadata")
        if task is not None and not serves(model.model.task, task):
            raise ApiError(
                424,
                f"model {model.name!r} serves {model.model.task}; {service} is for {task} models",
                "Backend",
            )
        return model

    async def run(self, call, model, op: str, texts: list, request, **options) -> list:
        for text in texts:
            if not (text if isinstance(text, str) else all(text)):
                raise ApiError(422, "`inputs` cannot be empty", "Empty")
        direction = request.truncation_direction
        if not 0 <= direction < len(DIRECTIONS):
            raise ApiError(
                422, f"truncation_direction {direction} is neither RIGHT (0) nor LEFT (1)"
            )
        return await self.core.run(
            call,
            model,
            op,
            texts,
            truncate=request.truncate,
            truncation_direction=DIRECTIONS[direction],
            **options,
        )

    def metadata(self, call) -> object:
        ms, ns = call.timings, 1_000_000
        return self.pb.Metadata(
            compute_chars=call.characters,
            compute_tokens=call.tokens,
            total_time_ns=int((time.perf_counter() - call.started) * 1e9),
            tokenization_time_ns=int(ms.get("tokenize_ms", 0.0) * ns),
            queue_time_ns=int(ms.get("queue_ms", 0.0) * ns),
            inference_time_ns=int(ms.get("inference_ms", 0.0) * ns),
        )

    # -- Info ------------------------------------------------------------------------------

    async def info(self, call, request):
        model = self.model(call, None, "Info")
        said = facts.info(self.core, model)
        return self.pb.InfoResponse(
            version=said["version"],
            model_id=said["model_id"],
            model_sha=said["model_sha"],
            model_dtype=said["model_dtype"],
            model_type=MODEL_TYPES[model.model.task],
            max_concurrent_requests=said["max_concurrent_requests"],
            max_input_length=said["max_input_length"],
            max_batch_tokens=said["max_batch_tokens"],
            max_batch_requests=said["max_batch_requests"],
            max_client_batch_size=said["max_client_batch_size"],
            tokenization_workers=said["tokenization_workers"],
        )

    # -- Embed -----------------------------------------------------------------------------

    async def embed(self, call, request):
        model = self.model(call, "embed", "Embed")
        prompt = request.prompt_name if request.HasField("prompt_name") else None
        results = await self.run(
            call, model, "embed", [request.inputs], request, prompt_name=prompt
        )
        dimensions = request.dimensions if request.HasField("dimensions") else None
        if dimensions == 0:
            raise ApiError(422, "dimensions must be at least 1")
        normalize = request.normalize if request.HasField("normalize") else True
        (vector,) = inputs.embeddings(results, dimensions, normalize)
        return self.pb.EmbedResponse(embeddings=vector.tolist(), metadata=self.metadata(call))

    async def embed_sparse(self, call, request):
        model = self.model(call, "sparse", "EmbedSparse")
        prompt = request.prompt_name if request.HasField("prompt_name") else None
        (result,) = await self.run(
            call, model, "sparse", [request.inputs], request, prompt_name=prompt
        )
        indices, values = weights(result)
        sparse = [
            self.pb.SparseValue(index=i, value=v)
            for i, v in zip(indices.tolist(), values.tolist(), strict=True)
        ]
        return self.pb.EmbedSparseResponse(sparse_embeddings=sparse, metadata=self.metadata(call))

    async def embed_all(self, call, request):
        """An embedding model's token vectors, unpooled; a late-interaction model's, one per
        token that counts, read as a query or a document (`prompt_name`)."""
        model = self.model(call, None, "EmbedAll")
        prompt = request.prompt_name if request.HasField("prompt_name") else None
        if model.model.task == "multivector":
            (result,) = await self.run(
                call, model, "multivector", [request.inputs], request, prompt_name=prompt
            )
            rows = MULTIVECTOR.from_wire(result).vectors
        else:
            self.model(call, "embed", "EmbedAll")
            (result,) = await self.run(
                call,
                model,
                "embed",
                [request.inputs],
                request,
                prompt_name=prompt,
                token_vectors=True,
            )
            rows = EMBED.from_wire(result).vectors
        vectors = [self.pb.TokenEmbedding(embeddings=v) for v in rows.tolist()]
        return self.pb.EmbedAllResponse(token_embeddings=vectors, metadata=self.metadata(call))

    # -- Predict ---------------------------------------------------------------------------

    async def predict(self, call, request):
        return await self._predict(call, request, request.inputs, "Predict")

    async def predict_pair(self, call, request):
        if len(request.inputs) != 2:
            raise ApiError(422, f"`inputs` must have two elements; got {len(request.inputs)}")
        return await self._predict(call, request, list(request.inputs), "PredictPair")

    async def _predict(self, call, request, text, service: str):
        model = self.model(call, "classify", service)
        (result,) = await self.run(
            call, model, "classify", [text], request, raw_scores=request.raw_scores
        )
        scores = result["logits" if request.raw_scores else "probs"]
        predictions = [
            self.pb.Prediction(label=label, score=p)
            for label, p in facts.predictions(model.model.path, scores)
        ]
        return self.pb.PredictResponse(predictions=predictions, metadata=self.metadata(call))

    # -- Rerank ----------------------------------------------------------------------------

    async def rerank(self, call, request):
        model = self.model(call, "rerank", "Rerank")
        if not request.texts:
            raise ApiError(422, "`texts` cannot be empty", "Empty")
        results = await self.run(
            call,
            model,
            "rerank",
            list(request.texts),
            request,
            query=request.query,
            raw_scores=request.raw_scores,
        )
        ranks = [(r["index"], r["logit" if request.raw_scores else "score"]) for r in results]
        return self._ranks(call, ranks, list(request.texts), request.return_text)

    async def rerank_stream(self, call, requests):
        """TEI's RerankStream: a (query, text) pair a message, one ranking at the end; the
        first message's raw_scores and return_text hold for all. Each query's texts run as
        one request."""
        model = self.model(call, "rerank", "RerankStream")
        pairs = [checked(r) async for r in requests]
        if not pairs:
            raise ApiError(422, "the stream held no message", "Empty")
        first = pairs[0]
        by_query: dict[str, list[int]] = {}
        for i, pair in enumerate(pairs):
            by_query.setdefault(pair.query, []).append(i)
        texts = [p.text for p in pairs]

        async def one(query: str, where: list[int]) -> list[tuple[int, float]]:
            results = await self.run(
                call,
                model,
                "rerank",
                [texts[i] for i in where],
                first,
                query=query,
                raw_scores=first.raw_scores,
            )
            key = "logit" if first.raw_scores else "score"
            return [(where[r["index"]], r[key]) for r in results]

        ranked = await asyncio.gather(*(one(q, w) for q, w in by_query.items()))
        return self._ranks(call, [r for group in ranked for r in group], texts, first.return_text)

    def _ranks(self, call, ranks: list[tuple[int, float]], texts: list[str], with_text: bool):
        ordered = sorted(ranks, key=lambda r: -r[1])
        return self.pb.RerankResponse(
            ranks=[
                self.pb.Rank(index=i, score=s, **({"text": texts[i]} if with_text else {}))
                for i, s in ordered
            ],
            metadata=self.metadata(call),
        )

    # -- Tokenize --------------------------------------------------------------------------

    async def tokenize(self, call, request):
        model = self.model(call, None, "Tokenize")
        text = request.inputs
        if request.HasField("prompt_name"):
            try:
                prompts = Prompts.read(resolve_model_path(model.model.path))
                (text,) = prompts.applied(request.prompt_name, [text])
            except PromptError as e:
                raise ApiError(422, str(e)) from None
        encoding = self.core.tokenizer(model).encode(
            text, add_special_tokens=request.add_special_tokens
        )
        return self.pb.EncodeResponse(
            tokens=[
                self.pb.SimpleToken(**{k: v for k, v in t.items() if v is not None})
                for t in inputs.tokens(encoding, text)
            ]
        )

    async def decode(self, call, request):
        model = self.model(call, None, "Decode")
        text = inputs.decode(
            self.core, model, list(request.ids), "ids", request.skip_special_tokens
        )
        return self.pb.DecodeResponse(text=text)
