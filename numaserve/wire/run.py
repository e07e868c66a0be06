"""A job a router shard sends an instance (RUN): one forward pass over its texts' token ids,
and what to read of each. Made by the shard, checked once where the instance takes it: a
job of another shape gets its error back, named, and the instance goes on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from numaserve.wire import protocol


class BadRun(ValueError):
    """A RUN that cannot be run as it is: the message says which part, for its error."""


@dataclass(frozen=True)
class Run:
    job: Any  # the shard's id for it, echoed in the RESULT
    inputs: Sequence[Sequence[int]]  # each text's token ids
    segments: list[int] | None = None  # a pair's second text's first token, in each input
    token_vectors: tuple[int, ...] = ()  # inputs (by index) whose every token's vector is read
    trace: tuple = ()  # the requests' trace contexts, where they are traced

    def to_wire(self) -> dict:
        body: dict = {"type": protocol.RUN, "job": self.job, "inputs": self.inputs}
        if self.segments is not None:
            body["segments"] = self.segments
        if self.token_vectors:
            body["token_vectors"] = list(self.token_vectors)
        if self.trace:
            body["trace"] = list(self.trace)
        return body

    @classmethod
    def from_wire(cls, body: dict, hidden_state: bool) -> Run:
        """`hidden_state`: whether the model answers with its hidden state (an embedding
        model), the only kind whose token vectors a job may read."""
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise BadRun("inputs must be a non-empty list")
        for i, ids in enumerate(inputs):
            if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                raise BadRun(f"input {i}: not a list of token ids")
        segments = body.get("segments")
        if segments is not None and not (
            isinstance(segments, list)
            and len(segments) == len(inputs)
            and all(
                type(s) is int and 0 <= s < len(ids)
                for s, ids in zip(segments, inputs, strict=True)
            )
        ):
            raise BadRun("segments must be a list with one index into each input")
        whole = body.get("token_vectors") or []
        if whole and not (
            hidden_state
            and isinstance(whole, list)
            and all(type(i) is int and 0 <= i < len(inputs) for i in whole)
        ):
            raise BadRun("token_vectors must list inputs of an embedding model's job by index")
        trace = body.get("trace") or ()
        return cls(body.get("job"), inputs, segments, tuple(whole), tuple(trace))
