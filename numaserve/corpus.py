"""The texts numaserve judges and measures model paths on, all shipped with it.

Real English prose that ships with every Python: the standard library's docstrings. Their
first sentences drive benchmarks with natural lengths; whole paragraphs and runs of them
(2-300 words) are prose of every length. Beside them, short texts as users send them
(short_texts.txt: queries, titles, chat lines, 3-20 tokens), where int8's errors are largest:
a vector of few tokens averages none of them out. The accuracy gate (backends/gate.py) judges
each model path on both."""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import inspect
import json
import re
import subprocess
import sys

MODULES = (
    "argparse",
    "asyncio",
    "base64",
    "calendar",
    "collections",
    "configparser",
    "csv",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "email.utils",
    "fractions",
    "functools",
    "gzip",
    "hashlib",
    "heapq",
    "html.parser",
    "http.client",
    "http.cookies",
    "imaplib",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "mailbox",
    "math",
    "mimetypes",
    "os",
    "pathlib",
    "pickle",
    "platform",
    "poplib",
    "pprint",
    "queue",
    "random",
    "re",
    "shlex",
    "shutil",
    "smtplib",
    "socket",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "tokenize",
    "traceback",
    "unittest",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "warnings",
    "wave",
    "xml.dom.minidom",
    "zipfile",
)
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)])\.(\s|$)")


def first_sentence(doc: str) -> str | None:
    paragraph = doc.strip().split("\n\n")[0]
    text = " ".join(paragraph.split())
    m = _SENTENCE_END.search(text)
    sentence = text[: m.start() + 1] if m else text
    words = sentence.split()
    if len(words) < 4 or len(sentence) > 400 or not sentence[0].isalpha():
        return None
    if any(ch in sentence for ch in "(){}[]=>") and len(words) < 8:
        return None  # signatures and code, not prose
    return sentence


def passages(doc: str) -> list[str]:
    """The prose paragraphs of a docstring, alone and in runs of 2 and 4, of 2-300 words."""
    paragraphs = [" ".join(p.split()) for p in doc.strip().split("\n\n")]
    prose = [
        p
        for p in paragraphs
        if p and p[0].isalpha() and sum(ch in "(){}[]=>" for ch in p) < len(p.split()) / 4
    ]
    runs = (" ".join(prose[i : i + n]) for i in range(len(prose)) for n in (1, 2, 4))
    return [text for text in runs if 2 <= len(text.split()) <= 300]


def stdlib_sentences_by_module() -> list[tuple[str, str]]:
    """(module, sentence) for each distinct first sentence, in a fixed order."""
    return list(_read_in_fresh_interpreter("sentences"))


def stdlib_passages() -> list[str]:
    """Each distinct docstring passage (passages()), in a fixed order: 6,000 texts, a median
    of 20 words and up to 300, on Python 3.11."""
    return [text for _, text in _read_in_fresh_interpreter("passages")]


@functools.cache
def _read_in_fresh_interpreter(kind: str) -> tuple[tuple[str, str], ...]:
    """Read in a fresh interpreter: packages patch the stdlib when imported (transformers adds
    Logger methods, others wrap inspect functions), and the corpus must not depend on what the
    caller happened to import."""
    out = subprocess.run(
        [sys.executable, "-I", "-m", "numaserve.corpus", kind],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple((module, text) for module, text in json.loads(out))


def _read_docstrings(kind: str) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for _, obj in sorted(vars(module).items()):
            if inspect.ismodule(obj):  # a submodule is there only if something imported it
                continue
            members = [obj]
            if inspect.isclass(obj) and getattr(obj, "__module__", "") == module.__name__:
                members += [m for _, m in sorted(vars(obj).items()) if callable(m)]
            for member in members:
                doc = getattr(member, "__doc__", None)
                if not isinstance(doc, str):
                    continue
                texts = passages(doc) if kind == "passages" else [first_sentence(doc)]
                for text in filter(None, texts):
                    seen.setdefault(text, name)
    return [(module, text) for text, module in seen.items()]


@functools.cache
def short_texts() -> tuple[str, ...]:
    """The shipped short texts (short_texts.txt), in its order."""
    lines = importlib.resources.files("numaserve").joinpath("short_texts.txt").read_text("utf-8")
    return tuple(line for line in lines.splitlines() if line and not line.startswith("#"))


def stdlib_sentences(limit: int | None = None) -> list[str]:
    return [sentence for _, sentence in stdlib_sentences_by_module()[:limit]]


if __name__ == "__main__":
    json.dump(_read_docstrings(sys.argv[1]), sys.stdout)
