"""One copy of the model in one worker: the part every backend shares.

A backend (torch.py, onnx.py) supplies only the forward pass: the model's shape facts, the
input checks and padding are here, and what follows the pass is the task's head (tasks/).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.tasks import TASKS
from numaserve.tasks.base import Task


def uses_token_types(task: Task, type_vocab_size: int) -> bool:
    """Whether the model is fed token_type_ids: where it has segment embeddings to tell a
    pair's two texts apart (BERT, ALBERT, ELECTRA) and its task reads pairs."""
    return task.reads_pairs and type_vocab_size >= 2


# Where int8 dot products accumulate straight into int32, activations may use all 8 bits; older
# AVX2 kernels sum pairs in int16 (vpmaddubsw) and saturate unless activations keep 7 bits.
INT32_ACCUMULATING_ISA = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def full_range_int8(isa: tuple[str, ...]) -> bool:
    """Whether int8 activations may use all 8 bits on a CPU with these ISA extensions."""
    return bool(INT32_ACCUMULATING_ISA & set(isa))


# Models whose position ids start after the padding id (fairseq's RoBERTa and its kin): of
# their max_position_embeddings (514), the first pad_token_id + 1 are never used, so 512 tokens
# fit, not 514.
POSITIONS_AFTER_PADDING = frozenset(
    {
        "roberta",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "mpnet",
        "longformer",
        "data2vec-text",
    }
)


def usable_positions(model_type: str | None, max_positions: int | None, pad_id: int) -> int | None:
    """How many tokens the model's position embeddings hold; None where it does not say."""
    if max_positions is not None and model_type in POSITIONS_AFTER_PADDING:
        return max_positions - pad_id - 1
    return max_positions


@dataclass(frozen=True)
class ModelFacts:
    """What serving needs of a checkpoint besides its weights.

    Read from config.json with the json module: transformers' AutoConfig imports torch."""

    vocab_size: int
    max_positions: int | None = None  # the most tokens it takes; None: the checkpoint does not say
    pad_id: int = 0
    id2label: Mapping[int, str] = field(default_factory=dict)
    problem_type: str | None = None
    type_vocab_size: int = 0  # segment embeddings: 2 where a pair's texts are told apart

    @classmethod
    def read(cls, directory: str | Path) -> ModelFacts:
        path = Path(directory) / "config.json"
        try:
            raw = json.loads(path.read_text())
            pad_id = raw.get("pad_token_id") or 0
            return cls(
                vocab_size=int(raw["vocab_size"]),
                max_positions=usable_positions(
                    raw.get("model_type"), raw.get("max_position_embeddings"), pad_id
                ),
                pad_id=pad_id,
                id2label={int(k): str(v) for k, v in (raw.get("id2label") or {}).items()},
                problem_type=raw.get("problem_type"),
                type_vocab_size=int(raw.get("type_vocab_size") or 0),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"cannot read {path}: {type(e).__name__}: {e}") from None

    def check(self, config: ModelConfig) -> None:
        if self.max_positions is not None and config.max_length > self.max_positions:
            raise ModelLoadError(
                f"model.max_length is {config.max_length}, but {config.path} has only "
                f"{self.max_positions} positions"
            )


@dataclass(frozen=True)
class Load:
    """What one model path is loaded with: its config (the path), the CPU's extensions, its
    intra-op threads, the artifact prepare built (None: torch, which loads the checkpoint),
    and the NUMA node the process is bound to (whose copy of shared weights it maps; None:
    the artifact's own file). Every runtime's model takes it (config/runtimes.py's `loads`)."""

    config: ModelConfig
    isa: tuple[str, ...] = ()
    threads: int = 1
    artifact: str | None = None
    node: int | None = None


class Model:
    """A loaded model that maps batches of token ids to its task's results.

    The backends share everything but the forward pass: the model's shape facts, the input
    checks, padding, and the task's head after it."""

    choice = None  # the PoolPath (config/paths.py) load_model's `auto` chose, where it chose
    prepared = None  # its pool's entry of the prepared record, where load_prepared loaded it
    accuracy = None  # what a precision the config names costs here (choice.named_cost)
    head_s = 0.0  # the last run's time in the task's head (pooling, a softmax), for its trace
    # The weights files it maps, shared with the other instances that map them
    # (node_weights.Weights); empty where it holds its weights in its own memory.
    weights: tuple = ()

    def __init__(self, config: ModelConfig, facts: ModelFacts, width: int) -> None:
        """width: the output's features, the hidden size (embed) or the classes (classify)."""
        facts.check(config)
        self.config = config
        self.pad_id = facts.pad_id
        self.vocab_size = facts.vocab_size
        self.task = TASKS[config.task]
        self.token_types = uses_token_types(self.task, facts.type_vocab_size)
        directory = resolve_model_path(config.path)
        self.head = self.task.head(facts, width, directory, config.path)

    @property
    def labels(self) -> tuple[str, ...]:
        """The model's labels in output order (classify, ner); () for the other tasks."""
        return self.head.labels

    def check_ids(self, ids: list[int]) -> str | None:
        """Why these token ids cannot run, or None."""
        if not ids:
            return "empty input"
        if len(ids) > self.config.max_length:
            return f"{len(ids)} tokens exceed model.max_length {self.config.max_length}"
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            return f"token ids must be in 0..{self.vocab_size - 1}"
        return None

    def _arrays(
        self, batch: list[list[int]], segments: list[int] | None, attended: list[int] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if self.config.padding == "max_length":
            width = self.config.max_length
        else:  # dynamic: a batch of one runs unpadded, a batch pads to its longest
            width = max(len(ids) for ids in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        types = np.zeros((len(batch), width), dtype=np.int64) if self.token_types else None
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq) if attended is None else attended[row]] = 1
            if types is not None and segments and segments[row]:
                types[row, segments[row] : len(seq)] = 1
        return ids, mask, types

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        """Logits (classify, rerank; per token for ner) or the last hidden state (embed), as
        float32. `types`: the token type ids, for a model that takes them (self.token_types),
        else None."""
        raise NotImplementedError

    def run(
        self, batch: list[list[int]], segments: list[int] | None = None, whole: Sequence[int] = ()
    ) -> list:
        """One forward pass: a result per input, as the task's head makes it (tasks/).
        `segments`: for each input, where the second text of a pair begins (0: a single text);
        `whole`: the inputs whose result is the output's own rows, one per token (embed's
        token vectors), not the head's."""
        ids, mask, types = self._arrays(batch, segments, self.head.attended(batch))
        out = self.forward(ids, mask, types)
        rows = {i: out[i, : len(batch[i])].copy() for i in whole}  # before a head works in place
        started = time.perf_counter()
        results = self.head(out, mask, batch)
        self.head_s = time.perf_counter() - started
        for i, matrix in rows.items():
            results[i] = matrix
        return results
