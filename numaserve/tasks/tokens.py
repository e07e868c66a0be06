"""What a tokenizer says of each token of a text, beyond its id: the router's tokenizer
(backends/tokenizer.py) fills it in, and ner's entities (entities.py) read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tokens:
    """What the tokenizer says of each token of one text (ner needs it for entities)."""

    offsets: tuple[tuple[int, int], ...]  # character span in the text
    special: tuple[bool, ...]  # [CLS], [SEP]: never an entity
    pieces: tuple[str, ...]  # the token as the vocabulary spells it ("##ing")
    unknown: tuple[bool, ...]  # the unknown token: a word of its own
