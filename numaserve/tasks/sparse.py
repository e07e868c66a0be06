"""sparse: a SPLADE model's sparse embedding of each text, one weight per vocabulary entry,
most of them zero, as sentence-transformers' SparseEncoder saves such a model: its masked-LM
head's logits, log(1 + relu(x)) of each token's, then the max (or sum) over the text's tokens.

Only the non-zero weights travel: their vocabulary indices (little-endian uint32) and values
(float32), as bytes, sorted by index.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json, read_modules
from numaserve.tasks.agreement import Verdict, cosine_verdict
from numaserve.tasks.base import Head, Output, Task
from numaserve.wire.protocol import embedding_from_wire, embedding_to_wire

if TYPE_CHECKING:
    import numpy as np

# The module types a SPLADE SparseEncoder has, by class name (the module path moved between
# versions: sentence_transformers.sparse_encoder.models, ...modules). Since v6 it saves a
# Transformer whose sentence_bert_config.json says transformer_task: fill-mask instead.
MLM, SPLADE, TRANSFORMER = "MLMTransformer", "SpladePooling", "Transformer"
STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SparseEmbedding:
    indices: np.ndarray  # uint32: the vocabulary entries whose weight is not zero, ascending
    values: np.ndarray  # float32: their weights
    tokens: int
    truncated: bool

    def dense(self, dim: int) -> np.ndarray:
        """The whole vector, `dim` (the vocabulary's size) weights."""
        import numpy as np

        out = np.zeros(dim, dtype=np.float32)
        out[self.indices] = self.values
        return out


@dataclass(frozen=True)
class Splade:
    """What the checkpoint's SpladePooling says: how tokens' weights become the text's."""

    strategy: str = "max"
    activation: str = "relu"

    @classmethod
    def read(cls, directory: Path, path: str) -> Splade:
        modules, kinds = read_modules(
            directory,
            f"{path} has no modules.json: task: sparse serves a SPLADE model as "
            "sentence-transformers' SparseEncoder saves it (MLMTransformer, SpladePooling)",
        )
        if kinds == [TRANSFORMER, SPLADE] and _fills_masks(directory / modules[0].get("path", "")):
            kinds[0] = MLM
        if kinds != [MLM, SPLADE]:
            raise ModelLoadError(
                f"{directory / 'modules.json'}: its modules are {', '.join(kinds) or 'none'}; numaserve "
                f"serves a SparseEncoder of {MLM} (or a fill-mask {TRANSFORMER}) then {SPLADE}"
            )
        config_file = directory / modules[1].get("path", "") / "config.json"
        config = read_json(config_file) if config_file.is_file() else {}
        splade = cls(
            str(config.get("pooling_strategy", "max")),
            str(config.get("activation_function", "relu")),
        )
        if splade.strategy not in STRATEGIES or splade.activation not in ACTIVATIONS:
            raise ModelLoadError(
                f"{config_file}: pooling_strategy {splade.strategy!r} and activation_function "
                f"{splade.activation!r}; numaserve has {' and '.join(STRATEGIES)}, and "
                f"{' and '.join(ACTIVATIONS)}"
            )
        return splade


def _fills_masks(module: Path) -> bool:
    """A v6 Transformer module run for its masked-LM logits."""
    config = module / "sentence_bert_config.json"
    return config.is_file() and read_json(config).get("transformer_task") == "fill-mask"


class Pooled(Head):
    def __init__(self, splade: Splade, vocabulary: int):
        self.splade, self.dim = splade, vocabulary

    def __call__(self, out, mask, batch):
        """One (indices, values) per text from the masked-LM logits (batch, tokens, vocab):
        SpladePooling's arithmetic, in place where it can be (the logits are the big array)."""
        import numpy as np

        weights = np.maximum(out, 0, out=out)  # relu
        weights *= mask[:, :, None]  # padding's weight is 0, which neither max nor sum sees
        np.log1p(weights, out=weights)
        if self.splade.activation == "log1p_relu":
            np.log1p(weights, out=weights)
        pooled = weights.max(axis=1) if self.splade.strategy == "max" else weights.sum(axis=1)
        results = []
        for row in pooled:
            (indices,) = np.nonzero(row)
            results.append((indices.astype(np.uint32), row[indices]))
        return results

    def describe(self) -> dict:
        return {"dim": self.dim}


def weights(result: dict) -> tuple[np.ndarray, np.ndarray]:
    """A result's vocabulary indices and their weights, as its worker sent them."""
    import numpy as np

    return np.frombuffer(result["indices"], dtype="<u4"), embedding_from_wire(result["values"])


class Sparse(Task):
    name = "sparse"
    output = Output.VOCAB_LOGITS

    def check_checkpoint(self, directory: Path, path: str) -> None:
        Splade.read(directory, path)

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Pooled(Splade.read(Path(directory), path), width)

    def to_wire(self, result) -> dict:
        import numpy as np

        indices, values = result
        return {
            "indices": np.asarray(indices, dtype="<u4").tobytes(),
            "values": embedding_to_wire(values),
        }

    def from_wire(self, result: dict) -> SparseEmbedding:
        return SparseEmbedding(*weights(result), result["tokens"], result["truncated"])

    def gate_answers(self, results, inputs, texts, labels, tokenizer) -> list:
        """Each text's weights by vocabulary index."""
        return [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in results]

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        """The cosine of the whole vectors, as for dense embeddings."""
        import numpy as np

        size = 1 + max((max(w, default=0) for w in (*answers, *reference)), default=0)

        def dense(weights: dict) -> np.ndarray:
            vector = np.zeros(size, dtype=np.float32)
            vector[list(weights)] = list(weights.values())
            return vector

        return cosine_verdict([dense(w) for w in answers], [dense(w) for w in reference])


SPARSE = Sparse()
