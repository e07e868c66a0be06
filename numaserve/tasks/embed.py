"""embed: one vector per text, pooled as the model's sentence-transformers modules say."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.tasks.base import Answers, Bad, Head, Output, Task, flag_option, windows_option
from numaserve.tasks.late_chunking import chunk_tokens, chunk_vectors, late_chunking_option
from numaserve.tasks.prompts import Prompts
from numaserve.wire import protocol

MAX_PROMPT_NAME = 128

if TYPE_CHECKING:
    import numpy as np

    from numaserve.tasks.pooling import Pooling


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # float32; unit length where the model normalises (bundled:minilm does)
    tokens: int
    truncated: bool
    chunks: int = 1  # a long text read in windows (max_chunks_per_doc): their vectors' mean


@dataclass(frozen=True)
class ChunkEmbeddings:
    """A text's chunks' vectors, late chunking's (tasks/late_chunking.py): one row a chunk."""

    vectors: np.ndarray  # float32, (chunks, dim)
    tokens: int
    truncated: bool


@dataclass(frozen=True)
class TokenEmbedding:
    """A text's token vectors (`token_vectors`; TEI's /embed_all): the model's last hidden
    state, one row per token, special tokens included, neither pooled nor normalised."""

    vectors: np.ndarray  # float32, (tokens, hidden size)
    tokens: int
    truncated: bool


class Pooled(Head):
    def __init__(self, pooling: Pooling, width: int):
        self.pooling = pooling
        self.dim = pooling.dim(width)

    def __call__(self, out, mask, batch):
        return list(self.pooling(out, mask))

    def describe(self) -> dict:
        return {"dim": self.dim}


class Windows(Answers):
    """A text read in windows (a request's max_chunks_per_doc) gets the mean of the windows'
    vectors, made unit length: summed as they come, normalised at the end. A text chunked
    late gets its chunks' vectors, from its token vectors."""

    def __init__(self, path: str, prompts: Prompts):
        self.path, self.prompts = path, prompts
        self._pooling: Pooling | None = None

    def best(self, kept: dict, new: dict) -> dict:
        total = protocol.embedding_from_wire(kept["embedding"])
        total = total + protocol.embedding_from_wire(new["embedding"])
        return {**kept, "embedding": protocol.embedding_to_wire(total)}

    def finish(self, request, encoded, results):
        import numpy as np

        if request.options.get("late_chunking"):
            return self._chunked(request, encoded, results)
        for result, enc in zip(results, encoded, strict=True):
            if enc.more:
                vector = protocol.embedding_from_wire(result["embedding"])
                result["embedding"] = protocol.embedding_to_wire(vector / np.linalg.norm(vector))
                result["chunks"] = len(enc.windows)
        return results

    def _chunked(self, request, encoded, results):
        """Each text's chunks' vectors, pooled from its token vectors."""
        if self._pooling is None:
            self._pooling = _pooling(Path(resolve_model_path(self.path)))
        option = request.options["late_chunking"]
        name = request.options.get("prompt_name")
        for i, (result, enc, text) in enumerate(zip(results, encoded, request.texts, strict=True)):
            shift = len(self.prompts.applied(name, [text])[0]) - len(text)
            rows = protocol.embedding_from_wire(result.pop("token_vectors"))
            chunks = chunk_tokens(option, i, enc.tokens, shift)
            vectors = chunk_vectors(rows.reshape(len(enc.ids), -1), chunks, self._pooling)
            result["chunk_embeddings"] = protocol.embedding_to_wire(vectors)
            result["chunks"] = len(chunks)
        return results


class Embed(Task):
    name = "embed"
    output = Output.HIDDEN_STATE
    option_keys = ("prompt_name", "token_vectors", "max_chunks_per_doc", "late_chunking")
    reads_windows = True  # where a request asks: max_chunks_per_doc

    def options(self, body: dict, bad: Bad) -> dict:
        name = body.get("prompt_name")
        if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_PROMPT_NAME):
            raise bad(
                f"prompt_name must be a prompt's name: a string of 1-{MAX_PROMPT_NAME} characters"
            )
        whole, chunks = flag_option(body, "token_vectors", bad), windows_option(body, bad)
        if whole and chunks not in (None, 1):
            raise bad("token_vectors reads a text once: max_chunks_per_doc cannot go with it")
        late = late_chunking_option(body, bad)
        if late and (whole or chunks not in (None, 1)):
            raise bad(
                "late_chunking reads each text once, whole: token_vectors and "
                "max_chunks_per_doc cannot go with it"
            )
        return {
            "prompt_name": name,
            "token_vectors": whole,
            "max_chunks_per_doc": chunks,
            "late_chunking": late,
        }

    def reads_rows(self, options: dict) -> bool:
        return bool(options.get("token_vectors") or options.get("late_chunking"))

    def tags(self, options: dict) -> bool:
        return bool(options.get("late_chunking"))  # each token's span, and which are special

    def answers(self, tokenizer, prompts) -> Windows:
        return Windows(tokenizer.path, prompts)

    def prompts(self, directory: Path) -> Prompts:
        return Prompts.read(directory)

    def check_checkpoint(self, directory: Path, path: str) -> None:
        pooling = _pooling(directory)  # refuses a module numaserve cannot run
        if any(Prompts.read(directory).table.values()) and not pooling.include_prompt:
            raise ModelLoadError(
                f"{path}: its Pooling leaves a prompt's tokens out (include_prompt: false), "
                "and numaserve pools every token: a prompted text's vector would be wrong"
            )

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Pooled(_pooling(directory), width)

    def to_wire(self, result) -> dict:
        """A pooled vector, or a text's token vectors (a matrix: Model.run's `whole`)."""
        key = "token_vectors" if result.ndim == 2 else "embedding"
        return {key: protocol.embedding_to_wire(result)}

    def from_wire(self, result: dict) -> Embedding | TokenEmbedding | ChunkEmbeddings:
        if "chunk_embeddings" in result:
            vectors = protocol.embedding_from_wire(result["chunk_embeddings"])
            rows = vectors.reshape(result["chunks"], -1)
            return ChunkEmbeddings(rows, result["tokens"], result["truncated"])
        if "token_vectors" in result:
            vectors = protocol.embedding_from_wire(result["token_vectors"])
            rows = vectors.reshape(result["tokens"], -1)
            return TokenEmbedding(rows, result["tokens"], result["truncated"])
        vector = protocol.embedding_from_wire(result["embedding"])
        return Embedding(vector, result["tokens"], result["truncated"], result.get("chunks", 1))


def _pooling(directory: Path) -> Pooling:
    from numaserve.tasks.pooling import Pooling  # numpy: only once the worker is pinned

    return Pooling.read(directory)


EMBED = Embed()
