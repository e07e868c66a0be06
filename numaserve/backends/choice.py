"""`quantize: auto`: the fastest model path (a backend and a precision) that passes the
accuracy gate (gate.py) on this CPU, measured once, at `numaserve prepare`, and kept.

Which path is fastest depends on the CPU (AMX, AVX512_BF16, VNNI or AVX2 alone) and on the
model; which one is accurate enough depends on the model and on the CPU's int8 kernels. So
each candidate is built, judged against the checkpoint in fp32 on the gate's texts, and timed
on the same texts, one at a time on one thread; the fastest that passes is chosen. The choice
is kept in CACHE/choice/KEY.json, where KEY hashes the model's files, the settings that change
the answer, the CPU's ISA extensions and the runtimes' versions: another CPU, another
runtime or another checkpoint chooses again. Workers read it; the first to find none makes it,
under a lock, as the supervisor's prepare step does before any worker starts.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.backends.race import Standing, race, ratios, winner
from numaserve.config import ModelConfig
from numaserve.config_precision import PRECISIONS
from numaserve.modelpath import ModelLoadError, resolve_model_path

if TYPE_CHECKING:
    from numaserve.backends.base import Model

log = logging.getLogger("numaserve.backends")
FORMAT = 2  # bump when the candidates or the gate change, so that old choices are made again
# The attention and feed-forward output projections, where BERT-like encoders' outlier
# activations live: int8 there moves embeddings most (docs/accuracy.md#the-gate).
PROJECTIONS = ("*.output.dense",)


@dataclass(frozen=True)
class ModelPath:
    backend: str
    quantize: str
    keep_fp32: tuple[str, ...] = ()

    def __str__(self) -> str:
        keep = f" keep_fp32 {','.join(self.keep_fp32)}" if self.keep_fp32 else ""
        return f"{self.backend} {self.quantize}{keep}"

    def applied_to(self, config: ModelConfig) -> ModelConfig:
        """`config` running this path."""
        return dataclasses.replace(
            config, backend=self.backend, quantize=self.quantize, keep_fp32=self.keep_fp32
        )


# Tried in this order; the fastest that passes wins. torch's and OpenVINO's fp32 are left out
# of `backend: auto`: never faster than onnxruntime's fp32 where measured (docs/benchmarks.md).
CANDIDATES = (
    ModelPath("ctranslate2", "int8"),
    ModelPath("onnxruntime", "int8"),
    ModelPath("openvino", "bf16"),
    ModelPath("onnxruntime", "int8", PROJECTIONS),
    ModelPath("onnxruntime", "none"),
    ModelPath("openvino", "none"),
    ModelPath("torch", "int8"),
    ModelPath("torch", "none"),
)
AUTO_BACKENDS = ("ctranslate2", "onnxruntime", "openvino")
GATE_MAX_TOKENS = 512  # the gate's longest passages (300 words) fit


@dataclass(frozen=True)
class Choice:
    path: ModelPath
    why: str  # one line for the log and `numaserve status`
    trials: tuple[dict, ...]  # each candidate: path, passed, figure, ms per text or skipped

    def to_json(self) -> dict:
        return {"path": dataclasses.asdict(self.path), "why": self.why, "trials": self.trials}

    @classmethod
    def from_json(cls, data: dict) -> Choice:
        path = data["path"]
        return cls(
            ModelPath(path["backend"], path["quantize"], tuple(path["keep_fp32"])),
            data["why"],
            tuple(data["trials"]),
        )


def candidates(backend: str) -> list[ModelPath]:
    scope = AUTO_BACKENDS if backend == "auto" else (backend,)
    return [c for c in CANDIDATES if c.backend in scope]


Load = Callable[[ModelConfig, tuple[str, ...]], "Model"]  # backends.load_model, for a named path


def concrete(
    config: ModelConfig, isa: tuple[str, ...], load: Load
) -> tuple[ModelConfig, Choice | None]:
    """The config with its backend and precision decided: `quantize: auto` from the choice
    (made now if none is kept), `backend: auto` with a named precision from the first backend
    that runs it (onnxruntime for int8 and none, openvino for bf16)."""
    if config.quantize != "auto":
        if config.backend != "auto":
            return config, None
        backend = next(b for b, offered in PRECISIONS.items() if config.quantize in offered)
        return dataclasses.replace(config, backend=backend), None
    choice = ensure_choice(config, isa, load)
    return choice.path.applied_to(config), choice


def choice_key(model_dir: Path, config: ModelConfig, isa: tuple[str, ...]) -> str:
    from numaserve.backends.artifacts import model_digest

    versions = {}
    for package in (
        "numaserve",
        "onnxruntime",
        "openvino",
        "ctranslate2",
    ):  # not torch: see onnx_build
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None  # not installed: its candidates are skipped
    settings = {
        "format": FORMAT,
        "task": config.task,
        "backend": config.backend,
        "isa": sorted(isa),
        "versions": versions,
    }
    digest = hashlib.sha256(model_digest(model_dir).encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def ensure_choice(
    config: ModelConfig, isa: tuple[str, ...], load: Load, root: Path | None = None
) -> Choice:
    """The kept choice for this model on this CPU, made first if there is none."""
    from numaserve.backends.artifacts import cache_root

    key = choice_key(Path(resolve_model_path(config.path)), config, isa)
    directory = (root or cache_root()) / "choice"
    kept = directory / f"{key}.json"
    if (choice := _read(kept)) is not None:
        return choice
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = (directory / f"{key}.lock").open("w")
    except OSError as e:
        raise ModelLoadError(
            f"quantize: auto has no choice kept for {config.path} on this CPU ({kept}), and "
            f"cannot make one there: {e.strerror}. Run `numaserve prepare --config FILE` where "
            "the cache is writable, or name the precision (model.backend, model.quantize)"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one chooser; the others wait, then read its choice
        if (choice := _read(kept)) is not None:
            return choice
        choice = choose(config, isa, load)
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False) as f:
            json.dump(choice.to_json(), f, indent=1)
        os.replace(f.name, kept)
        return choice


def _read(path: Path) -> Choice | None:
    try:
        return Choice.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none kept, or a damaged file: made again


def choose(
    config: ModelConfig, isa: tuple[str, ...], load: Load, texts: list[str] | None = None
) -> Choice:
    """Build and judge each candidate; race those that pass (race.py); the winner."""
    from numaserve.backends.gate import Gate, gate_texts
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.corpus import stdlib_passages

    config = gate_config(config)
    reference = load(dataclasses.replace(config, backend="torch", quantize="none"), isa)
    log.info(
        "quantize: auto: judging and timing each model path of %s on this CPU (once; kept)",
        config.path,
        extra={"event": "prepare"},
    )
    tokenizer = Tokenizer(config.path, config.max_length)
    gate = Gate(config.task, tokenizer, texts or gate_texts(stdlib_passages()), reference)
    del reference
    trials, passed = [], {}
    paths = candidates(config.backend)
    for number, path in enumerate(paths, 1):
        trial = {"path": str(path)}
        trials.append(trial)
        try:
            model = load(path.applied_to(config), isa)
        except ModelLoadError as e:
            trial["skipped"] = str(e)
            log.info("quantize: auto: %s skipped: %s", path, e, extra={"event": "prepare"})
            continue
        verdict = gate.judge(model)
        trial |= {"passed": verdict.passed, "figure": verdict.figure}
        if verdict.passed:
            passed[str(path)] = model  # kept loaded for the race
        log.info(
            "quantize: auto: candidate %d of %d, %s, %s the gate (%s)",
            number,
            len(paths),
            path,
            "passes" if verdict.passed else "fails",
            verdict.figure,
            extra={"event": "prepare"},
        )
    if not passed:
        raise ModelLoadError(
            f"quantize: auto: no model path of {config.path} passes the accuracy gate: "
            + "; ".join(f"{t['path']}: {t.get('figure') or t.get('skipped')}" for t in trials)
        )
    standings = race({n: partial(gate.run, m) for n, m in passed.items()}, gate.inputs)
    for standing in standings:
        trial = next(t for t in trials if t["path"] == standing.name)
        trial |= {"ms": round(standing.median, 3), "rounds": [round(x, 3) for x in standing.ms]}
    best, fastest = winner(standings)
    chosen = next(p for p in paths if str(p) == best.name)
    why = _why(best, fastest, standings, trials)
    return Choice(chosen, why, tuple(trials))


def gate_config(config: ModelConfig) -> ModelConfig:
    """The settings the gate runs with, whatever the config's: one choice serves every
    max_length and padding (batch 1 pads nothing), and its texts reach GATE_MAX_TOKENS."""
    from numaserve.backends.base import ModelFacts

    positions = ModelFacts.read(resolve_model_path(config.path)).max_positions
    tokens = min(GATE_MAX_TOKENS, positions or GATE_MAX_TOKENS)
    return dataclasses.replace(config, max_length=tokens, padding="dynamic", truncate=True)


def _why(best: Standing, fastest: Standing, standings: list[Standing], trials: list) -> str:
    """One line: the chosen path's speed, its lead and accuracy, and what faster ones lacked."""
    figure = next(t["figure"] for t in trials if t["path"] == best.name)
    rivals = [s for s in standings if s is not best]
    if best is fastest:
        line = f"the fastest that passes the gate: {best.median:.2f} ms a text, {figure}"
        if rivals:
            second = min(rivals, key=lambda s: s.median)
            r = ratios(best, second)
            line += (
                f"; {min(r):.2f}-{max(r):.2f}x faster than {second.name} round by round"
                f" ({len(r)} rounds)"
            )
    else:
        r = ratios(fastest, best)
        line = (
            f"passes the gate and takes less memory than {fastest.name}, whose lead is within"
            f" the rounds' noise ({best.median:.2f} against {fastest.median:.2f} ms a text,"
            f" {min(r):.2f}-{max(r):.2f}x round by round); {figure}"
        )
    failed = [t for t in trials if t.get("passed") is False]
    beaten = "; ".join(f"{t['path']} fails the gate ({t['figure']})" for t in failed)
    return line + (f"; {beaten}" if beaten else "")
