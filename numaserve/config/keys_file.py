"""The HTTP API's keys file (server.http_api_keys_file): one key per line, `#` comments, each
key at least 16 characters (shorter ones are too easy to guess); `KEY bulk` makes its
requests bulk unless they say otherwise (an indexing job's key). Read by the HTTP fronts, which
serve by it, and by `numaserve start`, which refuses a file they could not serve by."""

from __future__ import annotations

from dataclasses import dataclass

MIN_KEY_CHARS = 16


class KeysFileError(ValueError):
    """A keys file that cannot be read."""


@dataclass(frozen=True)
class KeysFile:
    keys: tuple[str, ...]  # those long enough, the ones served by
    short_lines: tuple[int, ...]  # the lines whose key is too short to be accepted
    bulk: frozenset[str] = frozenset()  # keys whose requests are bulk by default

    def short_keys_problem(self, path: str) -> str | None:
        if not self.short_lines:
            return None
        lines = ", ".join(map(str, self.short_lines))
        return (
            f"{path}: line{'s' if len(self.short_lines) > 1 else ''} {lines}: a key shorter than "
            f"{MIN_KEY_CHARS} characters, which this server never accepts (too easy to guess): "
            f"make each key {MIN_KEY_CHARS} characters or more (`openssl rand -hex 24` makes one)"
        )


def read_keys(path: str) -> KeysFile:
    """The file's keys, one a line, blank lines and `#` comments skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise KeysFileError(f"server.http_api_keys_file: cannot read {path}: {e}") from None
    keys, short, bulk = [], [], set()
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        key, *words = words
        if words not in ([], ["bulk"]):
            raise KeysFileError(
                f"server.http_api_keys_file: {path}: line {number}: after the key comes "
                f"nothing, or `bulk` (its requests are bulk by default); got {' '.join(words)!r}"
            )
        if len(key) < MIN_KEY_CHARS:
            short.append(number)
            continue
        keys.append(key)
        if words:
            bulk.add(key)
    return KeysFile(tuple(keys), tuple(short), frozenset(bulk))
