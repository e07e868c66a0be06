"""A model's own prompts, as sentence-transformers saves them (`prompts` and
`default_prompt_name` in config_sentence_transformers.json): read by the router shard, which
puts the one a request names before each of its texts as it tokenizes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json

Text = str | tuple[str, str]  # as requests.Text: a text, or a pair (never prompted)

PROMPTS_FILE = "config_sentence_transformers.json"


class PromptError(ValueError):
    """A request's prompt_name that is not one of the model's prompts."""


@dataclass(frozen=True)
class Prompts:
    """A checkpoint's own prompts, as sentence-transformers saves them: E5's "query: " and
    "passage: ", BGE's and GTE's instructions. The one a request names, else the model's
    default, goes before each of its texts, as SentenceTransformer.encode puts it there (and
    counts toward the token limit as there)."""

    table: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None

    @classmethod
    def read(cls, directory: Path) -> Prompts:
        path = Path(directory) / PROMPTS_FILE
        config = read_json(path) if path.is_file() else {}
        table = config.get("prompts") or {}
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()
        ):
            raise ModelLoadError(f"{path}: prompts must map names to texts")
        default = config.get("default_prompt_name") or None
        if default is not None and default not in table:
            raise ModelLoadError(
                f"{path}: default_prompt_name {default!r} is not one of its prompts "
                f"({', '.join(table) or 'it has none'})"
            )
        return cls(table, default)

    def prompt(self, name: str | None) -> str:
        """The text that goes before each text of a request naming prompt `name` (the
        default where None): "" where there is none."""
        name = self.default if name is None else name
        if name is None:
            return ""
        if name not in self.table:
            known = ", ".join(self.table) or "it has none"
            raise PromptError(f"prompt_name {name!r} is not one of this model's prompts ({known})")
        return self.table[name]

    def applied(self, name: str | None, texts: list[Text]) -> list[Text]:
        """`texts` with the prompt `name` before each (an embedding model's: its texts are
        never pairs, which are passed on as they are)."""
        prompt = self.prompt(name)
        return [prompt + t if isinstance(t, str) else t for t in texts] if prompt else texts

    def fitted(self, name: str | None, encoded: list) -> list:
        """The tokenized texts as the model reads them: as they are (a late-interaction
        model's queries are cut and expanded: tasks/multivector.py)."""
        return encoded


NO_PROMPTS = Prompts()
