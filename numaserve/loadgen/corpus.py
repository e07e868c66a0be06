"""Real English sentences that ship with every Python: the first sentences of the standard
library's docstrings. Used to measure accuracy and to drive benchmarks with natural lengths."""

from __future__ import annotations

import functools
import importlib
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


def stdlib_sentences_by_module() -> list[tuple[str, str]]:
    """(module, sentence) for each distinct first sentence, in a fixed order."""
    return list(_read_in_fresh_interpreter())


@functools.cache
def _read_in_fresh_interpreter() -> tuple[tuple[str, str], ...]:
    """Read in a fresh interpreter: packages patch the stdlib when imported (transformers adds
    Logger methods, others wrap inspect functions), and the corpus must not depend on what the
    caller happened to import."""
    out = subprocess.run(
        [sys.executable, "-I", "-m", "numaserve.loadgen.corpus"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple((module, sentence) for module, sentence in json.loads(out))


def _read_docstrings() -> list[tuple[str, str]]:
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
                if isinstance(doc, str) and (s := first_sentence(doc)):
                    seen.setdefault(s, name)
    return [(module, sentence) for sentence, module in seen.items()]


def stdlib_sentences(limit: int | None = None) -> list[str]:
    return [sentence for _, sentence in stdlib_sentences_by_module()[:limit]]


if __name__ == "__main__":
    json.dump(_read_docstrings(), sys.stdout)
