"""What tune writes: the user's config with the tuned keys set (the model path's backend and
precision, `placement.pools`, `server.max_batch` and `max_batch_tokens`), every other key as it
was and its paths made absolute (the file may go anywhere), under a comment that says what was
measured and what to expect; and the config a verification server runs."""

from __future__ import annotations

import copy

import yaml

from numaserve.config.paths import ModelPath
from numaserve.config.schema import Config
from numaserve.testing.server import ENDPOINT
from numaserve.tune.search import Candidate

POOL_NAMES = {1: ("main",), 2: ("short", "long"), 3: ("short", "mid", "long")}


def as_given_mapping(raw: dict, config: Config) -> dict:
    """The config as given, its paths absolute, as the config was read: the file tune writes
    may go anywhere, and the servers it verifies run from a directory of their own."""
    out = copy.deepcopy(raw)
    out.setdefault("model", {})["path"] = config.model.path
    server = out.get("server") or {}
    if config.server.curve:
        server["curve"] = {
            "secret_key_file": config.server.curve.secret_key_file,
            "authorized_keys_dir": config.server.curve.authorized_keys_dir,
        }
    if config.server.http_api_keys_file:
        server["http_api_keys_file"] = config.server.http_api_keys_file
    if server:
        out["server"] = server
    return out


def tuned_mapping(raw: dict, config: Config, candidate: Candidate, path: ModelPath) -> dict:
    """The config as given with the tuned keys set."""
    out = as_given_mapping(raw, config)
    model = out["model"]
    model["backend"], model["quantize"] = path.backend, path.quantize
    model.pop("keep_fp32", None)
    if path.keep_fp32:
        model["keep_fp32"] = list(path.keep_fp32)
    names = POOL_NAMES[len(candidate.pools)]
    out.setdefault("placement", {})["pools"] = [
        {
            "name": name,
            "max_tokens": p.max_tokens,
            "cores_per_instance": p.cores,
            "instances": p.instances,
        }
        for name, p in zip(names, candidate.pools, strict=True)
    ]
    server = out.setdefault("server", {})
    server["max_batch"], server["max_batch_tokens"] = (
        candidate.max_batch,
        candidate.max_batch_tokens,
    )
    return out


def verification_text(mapping: dict) -> str:
    """The config a verification server runs: loopback on a free port (@ENDPOINT@), no HTTP,
    no metrics endpoint, no cache, nothing a remote client needs."""
    out = copy.deepcopy(mapping)
    server = out.setdefault("server", {})
    for key in ("curve", "insecure", "http_api_keys_file"):
        server.pop(key, None)
    server |= {"endpoint": ENDPOINT, "metrics": "", "http": "", "cache_entries": 0}
    return yaml.safe_dump(out, sort_keys=False)


def tuned_text(mapping: dict, comment: list[str]) -> str:
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment)
    return header + yaml.safe_dump(mapping, sort_keys=False)
