"""What every task supplies, at each step a request of it passes through.

A request is parsed (`options`, `inputs`), run by a worker's model (`check_checkpoint`, `head`,
`to_wire`), finished by its router shard (`answers`) and read by the client (`from_wire`). The
steps that are the same for every task (ids, texts, deadlines, tokens, batching) are not here.

Nothing here imports numpy at module level: a worker imports this before it pins itself, and
importing numpy starts OpenBLAS's threads on every CPU (see wire/protocol.py).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from numaserve.tasks.agreement import Verdict, cosine_verdict
from numaserve.tasks.prompts import NO_PROMPTS, Prompts

Bad = Callable[[str], Exception]  # makes the bad_request error for a message


class Request(Protocol):
    """What a task reads of a request (requests.Request, which names the task by TASKS, so
    the tasks name it by its shape)."""

    @property
    def texts(self) -> tuple: ...

    @property
    def options(self) -> dict[str, Any]: ...


class Tokenizer(Protocol):
    """What a task asks of the router's tokenizer (backends/tokenizer.py)."""

    word_aware: bool  # whole words known from the pieces (ner's aggregation)
    path: str  # the model's, as the config names it

    def encode(self, texts: list, truncate: bool | None = None, left: bool = False) -> list: ...

    def encode_tagged(
        self, texts: list[str], truncate: bool | None = None, left: bool = False
    ) -> list: ...


class Output(str, Enum):
    """Which of a transformers model's outputs a task reads (and so which head it loads)."""

    HIDDEN_STATE = "last_hidden_state"  # AutoModel
    SEQUENCE_LOGITS = "sequence_logits"  # AutoModelForSequenceClassification
    TOKEN_LOGITS = "token_logits"  # AutoModelForTokenClassification
    VOCAB_LOGITS = "vocab_logits"  # AutoModelForMaskedLM: each token's over the vocabulary

    @property
    def logits(self) -> bool:
        return self is not Output.HIDDEN_STATE

    def width(self, config) -> int:
        """The output's last dimension, from a transformers config."""
        if self is Output.HIDDEN_STATE:
            return config.hidden_size
        return config.vocab_size if self is Output.VOCAB_LOGITS else config.num_labels


class Head:
    """How a model's output becomes a task's results, in the worker (numpy arrays in)."""

    labels: tuple[str, ...] = ()
    hides_tokens = False  # some inputs' tokens are read but not attended to (`attended`)

    def __call__(self, out, mask, batch: list[list[int]]) -> list:
        """One result per input of the batch: `out` is the model's output (float32), `mask`
        the attention mask, `batch` the token ids as run."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What a worker's READY says about the model beyond its task (labels, dim)."""
        return {}

    def attended(self, batch: list[list[int]]) -> list[int] | None:
        """How many of each input's tokens the encoder attends to; None: all of them."""
        return None


class Answers:
    """What a router shard adds to its instances' results before it answers (the results
    already carry `tokens` and `truncated`)."""

    def learn(self, labels: tuple[str, ...]) -> None:
        """An instance's READY: the labels it says its model has, where it has any."""

    def finish(self, request: Request, encoded: list, results: list[dict]) -> list[dict]:
        return results

    def arrived(self, request: Request, index: int, ids: tuple[int, ...], result: dict) -> dict:
        """An instance's result for input `index` of `request`, read from `ids` (one window
        of a long input), as it arrives: before `best` puts windows together."""
        return result

    def best(self, kept: dict, new: dict) -> dict:
        """Of two windows' results for one input, what stands for both (a task that reads
        windows: rerank's best score, embed's summed vector, late interaction's rows)."""
        raise NotImplementedError(f"{type(self).__name__} reads no input in windows")


class RawScores(Answers):
    """For a task whose results carry the model's logits beside its scores (`raw`: the
    result's key), which are answered only to a request that asks (`raw_scores: true`,
    as TEI has it): one cached result serves both."""

    raw: str

    def finish(self, request: Request, encoded: list, results: list[dict]) -> list[dict]:
        if not request.options.get("raw_scores"):
            for result in results:
                result.pop(self.raw, None)
        return results


MAX_WINDOWS = 64  # the windows one input is read in, at most: its cost grows with each


def windows_option(body: dict, bad: Bad) -> int | None:
    """max_chunks_per_doc: the windows a long input may be read in (1: it is cut)."""
    chunks = body.get("max_chunks_per_doc")
    if chunks is not None and (
        isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= MAX_WINDOWS
    ):
        raise bad(
            f"max_chunks_per_doc must be an integer of 1-{MAX_WINDOWS} (1: a text longer than the "
            "model reads is cut to it; more: it is read in that many windows at most)"
        )
    return chunks


def flag_option(body: dict, key: str, bad: Bad) -> bool | None:
    """A task's yes-or-no request key (raw_scores, token_vectors); None where left out."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise bad(f"{key} must be true or false")
    return value


class Task:
    """One task numaserve serves. Subclasses set the class attributes and override the steps
    where they differ from embed's plain "one text in, one result out"."""

    name: str
    output: Output
    takes_pairs: bool = False  # a request's text may be a pair [a, b]
    # The model reads pairs of texts (a pair, or rerank's query and document), so it is fed
    # token type ids where it has segment embeddings to tell the two apart.
    reads_pairs: bool = False
    inputs_are: str = "texts"  # what the request's `texts` are, in its errors
    option_keys: tuple[str, ...] = ()  # the request keys of this task alone
    needs_tokens = False  # its router shard reads each token's offsets and pieces
    # A long input may be read in windows (max_chunks_per_doc), its windows' results combined
    # by its Answers' `best`: by default (rerank's documents, up to the model's
    # max_chunks_per_doc), or where a request asks (embed's texts).
    reads_windows = False
    windows_by_default = False
    cached = True  # its results may answer the same text again, from the router's cache
    answers_per_token = False  # a vector per token, hundreds of times a pooled vector's size
    # Other tasks' requests its model answers too (a late-interaction model's rerank, by
    # MaxSim), their inputs read by `encode_for`.
    serves_also: tuple[str, ...] = ()

    def options(self, body: dict, bad: Bad) -> dict[str, Any]:
        """This task's own request fields, checked, with their defaults filled in."""
        return {}

    def reads_rows(self, options: dict) -> bool:
        """Whether a request's results are its instances' token vectors (never cached), which
        its router shard reads: embed's token_vectors and late chunking."""
        return False

    def tags(self, options: dict) -> bool:
        """Whether a request's texts are tokenized with each token's span and spelling."""
        return self.needs_tokens

    def inputs(self, request: Request) -> list:
        """What the model reads for a request: its texts (or pairs)."""
        return list(request.texts)

    def prompts(self, directory: Path) -> Prompts:
        """The checkpoint's own prompts a request may name (an embedding model's)."""
        return NO_PROMPTS

    def encode_for(
        self, request: Request, tokenizer: Tokenizer, prompts: Prompts, windows: int
    ) -> list:
        """The tokenized inputs of a request of another task this one serves (serves_also),
        as its model reads them; a long one in up to `windows` windows, where it reads so."""
        raise NotImplementedError(f"{self.name} serves no other task's requests")

    def check_checkpoint(self, directory: Path, path: str) -> None:
        """Refuse, with a ModelLoadError, a checkpoint this task cannot serve: at prepare,
        before an export that can take minutes."""

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        """The head for a checkpoint: `facts` its ModelFacts, `width` the output's last
        dimension (the hidden size, or the number of labels)."""
        raise NotImplementedError

    def to_wire(self, result) -> dict:
        """One result of the head, as the worker sends it to the router."""
        raise NotImplementedError

    def answers(self, tokenizer: Tokenizer, prompts: Prompts) -> Answers:
        """What its router shard adds to results; `prompts`: what `prompts` read."""
        return Answers()

    def from_wire(self, result: dict):
        """One result of a reply, as the client library returns it."""
        raise NotImplementedError

    # -- the accuracy gate (backends/gate.py): a model path against fp32 ----------------------

    def gate_inputs(self, tokenizer: Tokenizer, texts: list[str]) -> list:
        """The encoded inputs the gate runs, from its texts: each text alone."""
        return tokenizer.encode(texts)

    def gate_lengths(self, inputs: list) -> list[int]:
        """Each answer's length in tokens, for the gate's bands: here an answer per input."""
        return [len(e.ids) for e in inputs]

    def gate_answers(self, results: list, inputs: list, texts: list[str], labels, tokenizer):
        """What the gate compares with fp32's, from the head's results: the results."""
        return results

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        return cosine_verdict(answers, reference)


def labels_of(facts, width: int) -> tuple[str, ...]:
    """A classifier's label names in output order, as transformers names an unnamed one."""
    return tuple(facts.id2label.get(i, f"LABEL_{i}") for i in range(width))


def softmax(out):
    """Over the last axis, as float32 where `out` is."""
    import numpy as np

    exp = np.exp(out - out.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)
