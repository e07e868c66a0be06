"""What every API's calls share: their inputs read into texts, and embeddings made into
what a request asked for (cut to `dimensions`, normalised).

numpy is imported where it is used: a front imports this before it pins itself, and numpy's
import starts OpenBLAS's threads on every CPU (see wire/protocol.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from numaserve.front.errors import ApiError
from numaserve.processes.specs import FrontModel

if TYPE_CHECKING:
    import numpy as np

    from numaserve.front.core import Core


def given(body: dict, key: str) -> object:
    """`body[key]`; where it is missing, a 422 that names the keys the body has instead (a
    misspelt `input` is a common first mistake)."""
    if key in body:
        return body[key]
    others = ", ".join(f"`{k}`" for k in body if k != "model")
    instead = f"; it has {others}, which this route does not read" if others else ""
    raise ApiError(422, f"the body has no `{key}`{instead}")


def texts(core: Core, model: FrontModel, value: object, key: str) -> list[str]:
    """A string, a list of strings, or token ids (a list of ints, or a list of them): ids are
    decoded to their text by the model's tokenizer, which the shard tokenizes again."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and not value:
        raise ApiError(422, f"{key} is an empty list: give at least one text", "Empty")
    if not isinstance(value, list):
        raise ApiError(422, f"{key} must be a string, a non-empty list of strings, or token ids")
    if all(isinstance(v, str) for v in value):
        return value
    if all(_is_ids(v) for v in value):
        return [decode(core, model, ids, key) for ids in value]
    if _is_ids(value):
        return [decode(core, model, value, key)]
    raise ApiError(422, f"{key} must be a string, a list of strings, or token ids")


def _is_ids(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    )


def decode(core: Core, model: FrontModel, ids: object, key: str, skip_special: bool = True) -> str:
    """Token ids back to text by the model's tokenizer; ids that are not its are a 422."""
    tokenizer = core.tokenizer(model)
    size = tokenizer.get_vocab_size()
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ApiError(422, f"{key} must be token ids (0-{size - 1}), or a list of lists of them")
    bad = next((i for i in ids if not 0 <= i < size), None)
    if bad is not None:
        raise ApiError(422, f"{key}: token id {bad} is not in the vocabulary (0-{size - 1})")
    return tokenizer.decode(ids, skip_special_tokens=skip_special)


def kept_tokens(core: Core, model: FrontModel, text: str, most: int, left: bool = False) -> str:
    """`text` cut to its first `most` tokens (with `left`, its last), as the model's
    tokenizer splits it."""
    encoding = core.tokenizer(model).encode(text, add_special_tokens=False)
    if len(encoding.ids) <= most:
        return text
    if left:
        return text[encoding.offsets[-most][0] :]
    return text[: encoding.offsets[most - 1][1]]


def dimensions_of(body: dict, key: str = "dimensions") -> int | None:
    """How many of each vector's first values a request wants (OpenAI's and TEI's
    `dimensions`, Cohere's `output_dimension`); None for all."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(422, f"{key} must be an integer of at least 1")
    return value


def embeddings(results: list[dict], dimensions: int | None, normalize: bool) -> list[np.ndarray]:
    """Each result's vector: its first `dimensions` values, as Matryoshka models are cut, then
    scaled to unit length where `normalize` (a cut vector always is)."""
    import numpy as np

    vectors = []
    for result in results:
        vector = np.frombuffer(result["embedding"], dtype="<f4")
        if dimensions is not None:
            if dimensions > len(vector):
                raise ApiError(
                    422, f"dimensions is {dimensions}; this model's embeddings have {len(vector)}"
                )
            vector, normalize = vector[:dimensions], True
        if normalize:
            norm = float(np.linalg.norm(vector))
            if norm > 0 and abs(norm - 1.0) > 1e-6:
                vector = vector / np.float32(norm)
        vectors.append(vector)
    return vectors


def quantized(vectors: list[np.ndarray], kind: str) -> list[list]:
    """Unit vectors as a vector database stores them (Cohere's embedding types), as JSON's
    numbers: `stored`'s values."""
    if kind == "float":
        return [v.tolist() for v in vectors]
    import numpy as np

    return stored(np.stack(vectors), kind).tolist()


STORED_TYPES = ("float", "float16", "int8", "uint8", "binary", "ubinary")


def stored(matrix: np.ndarray, kind: str) -> np.ndarray:
    """Unit vectors (rows) in one of STORED_TYPES: float, as float32; float16; int8, each value
    x as round(127 x); uint8, round(127.5 (x + 1)); binary and ubinary, one bit a dimension
    (x > 0), eight to a byte, most significant first, as sentence-transformers'
    quantize_embeddings packs them (binary's bytes less 128, as signed ones)."""
    import numpy as np

    if kind in ("float", "float16"):
        return matrix.astype("<f4" if kind == "float" else "<f2")
    if kind in ("binary", "ubinary"):
        packed = np.packbits(matrix > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if kind == "binary" else packed
    if kind == "int8":
        return np.clip(np.rint(matrix * 127), -128, 127).astype(np.int8)
    return np.clip(np.rint((matrix + 1) * 127.5), 0, 255).astype(np.uint8)


def prompt_tokens(results: list[dict]) -> int:
    return sum(result["tokens"] for result in results)


def chunks(result: dict) -> dict:
    """A reranked document read in windows: how many were scored, and whether
    max_chunks_per_doc cut it. Nothing for a document that fit, so that the APIs' own shapes
    are left as they are for what they describe."""
    if result.get("chunks", 1) == 1:
        return {}
    return {"chunks": result["chunks"], "chunks_cut": result["truncated"]}


def tokens(encoding, text: str) -> list[dict]:
    """TEI's SimpleToken of each token of `text` (a tokenizer's encoding of it): a special
    token has no span; another, its text and span in `text`."""
    tokens = []
    for token_id, token, (start, stop), special in zip(
        encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
    ):
        if special:
            tokens.append(
                {"id": token_id, "text": token, "special": True, "start": None, "stop": None}
            )
        else:
            tokens.append(
                {
                    "id": token_id,
                    "text": text[start:stop],
                    "special": False,
                    "start": start,
                    "stop": stop,
                }
            )
    return tokens
