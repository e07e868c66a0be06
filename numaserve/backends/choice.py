"""`quantize: auto`: for each pool and each band of its lengths, the fastest model path (a
backend and a precision) that passes the accuracy gate (gate.py) there on this CPU, measured
once, at `numaserve prepare`, and kept.

Which path is fastest depends on the CPU (AMX, AVX512_BF16, VNNI or AVX2 alone), on the model
and on the texts' lengths (bf16 on AMX pays on long texts, int8 on short ones); which one is
accurate enough depends on the model, the CPU's int8 kernels and the lengths too (int8 loses
most on the shortest texts). So each candidate is built and judged against the checkpoint in
fp32 in each band of lengths; then, in each band of each pool's lengths, those that pass there
race (race.py) on the gate's texts of those lengths, alone and in the micro-batches the pool
runs under load, in alternating rounds. The pool's longest band decides its own path; a
shorter band runs another (PoolPath.shorter; banded.py) only where the pool's own fails
there or loses by more than the rounds' noise; and where two are within the noise, the one
listed first (less memory) wins. The
choice is kept in CACHE/choice/KEY.json, where KEY hashes the model's files, the settings that
change the answer, the CPU's ISA extensions, the runtimes' versions and the pools' bands:
another CPU, runtime, checkpoint or pool layout chooses again. `numaserve prepare` makes it,
under a lock, before any instance starts, and tells each instance its pool's path
(prepared.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.backends.artifacts import installed_version
from numaserve.backends.gate import Judgement, Span, length_bands, run_in_batches
from numaserve.backends.race import ROUNDS, Standing, race, ratios, winner
from numaserve.checkpoint.errors import MissingRuntime, ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.paths import BandPath, BatchedPath, ModelPath, PoolPath
from numaserve.config.runtimes import PRECISIONS, RUNTIMES, runtime
from numaserve.config.schema import MAX_PATHS, ModelConfig
from numaserve.processes.prepared import write_atomically

if TYPE_CHECKING:
    from numaserve.backends.base import Model

log = logging.getLogger("numaserve.backends")
PREPARE = {"event": "prepare"}  # what every line of the choice is logged with
FORMAT = 6  # bump when the candidates or the gate change, so that old choices are made again
# The attention and feed-forward output projections, where BERT-like encoders' outlier
# activations live: int8 there moves embeddings most (docs/accuracy.md#the-gate).
PROJECTIONS = ("*.output.dense",)


# Tried in this order, which is also their memory per instance's, least first (PSS loaded
# alone: docs/benchmarks.md#model-paths): where two paths' speeds are within the noise, the
# one listed first wins. torch's and OpenVINO's fp32 are left out of `backend: auto`: never
# faster than onnxruntime's fp32 where measured (docs/benchmarks.md).
CANDIDATES = (
    ModelPath("ctranslate2", "int8"),
    ModelPath("onnxruntime", "int8"),
    ModelPath("onnxruntime", "int8", PROJECTIONS),
    # NNCF's static int8, activations' scales calibrated (openvino_build.py): accurate on
    # passages where onnxruntime's dynamic int8 is not, and faster on long texts.
    ModelPath("openvino", "int8"),
    # int16 products (MKL's, on Intel CPUs only; skipped elsewhere): accurate where int8 is
    # not, on short texts, and about twice fp32's speed there (docs/accuracy.md#the-gate).
    ModelPath("ctranslate2", "int16"),
    ModelPath("onnxruntime", "none"),
    ModelPath("openvino", "bf16"),
    ModelPath("openvino", "none"),
    ModelPath("torch", "int8"),
    ModelPath("torch", "none"),
)
AUTO_BACKENDS = tuple(r.name for r in RUNTIMES if r.in_auto)
# Whose versions a choice depends on: numaserve's and the runtimes' (torch's own exports an
# equivalent graph: onnx_build.py).
VERSIONED = ("numaserve", *(p for r in RUNTIMES for p in r.packages))
# The fp32 reference the gate judges every path against (it loads the checkpoint as it is).
REFERENCE = ModelPath("torch", "none")
GATE_MAX_TOKENS = 512  # the gate's longest passages (300 words) fit
JUDGING_THREADS = 4  # a named precision's judgement runs on up to this many CPUs
BAND_INPUTS = 25  # a pool whose length range holds fewer of the gate's texts: the nearest
RACE_INPUTS = 100  # a band that holds more is timed on this many, spread over its lengths


@dataclass(frozen=True)
class Band:
    """What one pool's instances run: texts of shortest+1..longest tokens, alone and, under
    load, in micro-batches (server.max_batch, max_batch_tokens)."""

    pool: str
    shortest: int  # the next shorter pool's max_tokens; 0 for the first
    longest: int

    def holds(self, tokens: int) -> bool:
        return self.shortest < tokens <= self.longest

    @property
    def span(self) -> Span:
        return Span(self.shortest + 1, self.longest)

    def distance(self, tokens: int) -> int:
        return max(0, self.shortest + 1 - tokens, tokens - self.longest)


def bands(pools, max_length: int) -> tuple[Band, ...]:
    """Each pool's band, from its max_tokens (config.PoolConfig), shortest first."""
    bounds = sorted({min(p.max_tokens, max_length) for p in pools})
    shortest = {b: ([0, *bounds][i]) for i, b in enumerate(bounds)}
    return tuple(
        Band(p.name, shortest[min(p.max_tokens, max_length)], min(p.max_tokens, max_length))
        for p in sorted(pools, key=lambda p: p.max_tokens)
    )


@dataclass(frozen=True)
class Batching:
    """The server's micro-batching, which sets how many texts a pool runs at once under load."""

    max_batch: int = 1
    max_batch_tokens: int = 1

    def size(self, tokens: float) -> int:
        return max(1, min(self.max_batch, int(self.max_batch_tokens // max(tokens, 1))))


ALONE = Batching()  # each text alone: a server with max_batch 1, and the default


@dataclass(frozen=True)
class Choice:
    pools: dict[str, PoolPath]  # each pool's path, by the pool's name
    trials: tuple[dict, ...]  # each candidate: path, passed, figure, its times by pool, or skipped

    def for_pool(self, pool: str | None = None) -> PoolPath:
        """A pool's choice; without a name, the first (a config of one pool)."""
        return self.pools[pool] if pool is not None else next(iter(self.pools.values()))

    def to_json(self) -> dict:
        pools = {name: c.to_json() for name, c in self.pools.items()}
        return {"pools": pools, "trials": self.trials}

    @classmethod
    def from_json(cls, data: dict) -> Choice:
        pools = {name: PoolPath.from_json(p) for name, p in data["pools"].items()}
        return cls(pools, tuple(data["trials"]))


def candidates(backend: str) -> list[ModelPath]:
    scope = AUTO_BACKENDS if backend == "auto" else (backend,)
    return [c for c in CANDIDATES if c.backend in scope]


Loader = Callable[[ModelConfig, tuple[str, ...]], "Model"]  # backends.load_model, for a named path


def concrete(
    config: ModelConfig, isa: tuple[str, ...], load: Loader
) -> tuple[ModelConfig, PoolPath | None]:
    """The config with its backend and precision decided, for a server of one pool over
    every length: `quantize: auto` from the choice (made now if none is kept), `backend: auto`
    with a named precision from the first backend that runs it (onnxruntime for int8 and
    none, openvino for bf16, ctranslate2 for int16). A server's instances are told their
    pool's path by `numaserve prepare` instead (processes/prepared.py)."""
    if config.quantize != "auto":
        return named(config), None
    choice = ensure_choice(config, isa, load).for_pool()
    return choice.path.applied_to(config), choice


def named(config: ModelConfig) -> ModelConfig:
    """A config with a named precision, its backend decided."""
    if config.backend != "auto":
        return config
    backend = next(b for b, offered in PRECISIONS.items() if config.quantize in offered)
    return dataclasses.replace(config, backend=backend)


def verdicts_key(digest: str, config: ModelConfig, isa: tuple[str, ...]) -> str:
    """What the gate's verdicts were made for: the checkpoint (its digest), the task and
    scope, the CPU and the runtimes' versions; not the pools, which only the race depends on."""
    settings = {
        "format": FORMAT,
        "task": config.task,
        "backend": config.backend,
        "isa": sorted(isa),
        "versions": _versions(VERSIONED),  # None for one not installed: its candidates skipped
    }
    return _key(digest, settings)


def named_key(digest: str, config: ModelConfig, isa: tuple[str, ...]) -> str:
    """What a named precision's judgement was made for: the checkpoint, the task, the path,
    the CPU, and the versions of numaserve and of the path's own runtime only, so
    that an installation without the others (the container image's runtime) finds what its
    build judged on the same CPU."""
    settings = {
        "format": FORMAT,
        "task": config.task,
        "path": str(ModelPath(config.backend, config.quantize, config.keep_fp32)),
        "isa": sorted(isa),
        "versions": _versions(("numaserve", config.backend)),
    }
    return _key(digest, settings)


def choice_key(
    digest: str,
    config: ModelConfig,
    isa: tuple[str, ...],
    pools: tuple[Band, ...],
    batching: Batching,
) -> str:
    """What a kept choice was made for: the gate's verdicts' key, and the pools' bands and
    batching its race was run for; not the pools' names (`_read` gives a choice the names
    asked for), so that two configs of the same bands share one choice."""
    layout = {
        "pools": [[b.shortest, b.longest] for b in pools],
        "batching": dataclasses.asdict(batching),
        "max_paths": config.max_paths,
    }
    return _key(verdicts_key(digest, config, isa), layout)


def _versions(packages) -> dict[str, str | None]:
    """Each package's installed version; None where it is not installed."""
    return {package: installed_version(package) for package in packages}


def _key(seed: str, settings: dict) -> str:
    """A cache key: `seed` (a digest, or another key) and `settings`, hashed."""
    key = hashlib.sha256(seed.encode())
    key.update(json.dumps(settings, sort_keys=True).encode())
    return key.hexdigest()[:32]


def ensure_choice(
    config: ModelConfig,
    isa: tuple[str, ...],
    load: Loader,
    pools: tuple[Band, ...] | None = None,
    batching: Batching = ALONE,
    root: Path | None = None,
    digest: str | None = None,
) -> Choice:
    """The kept choice for this model, its pools and this CPU, made first if there is none.
    `pools`: by default one over every length; `digest`: the checkpoint's, if known."""
    from numaserve.backends.artifacts import cache_root, kept_or_made, model_digest

    pools = pools or (Band("default", 0, config.max_length),)
    digest = digest or model_digest(Path(resolve_model_path(config.path)))
    key = choice_key(digest, config, isa, pools, batching)
    directory = (root or cache_root()) / "choice"
    kept = directory / f"{key}.json"

    def made() -> Choice:
        verdicts = directory / f"gate-{verdicts_key(digest, config, isa)}.json"
        choice = choose(config, isa, load, pools=pools, batching=batching, verdicts=verdicts)
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False) as f:
            json.dump(choice.to_json(), f, indent=1)
        os.replace(f.name, kept)
        return choice

    def cannot(e: OSError) -> ModelLoadError:
        return ModelLoadError(
            f"quantize: auto has no choice kept for {config.path} on this CPU ({kept}), and "
            f"cannot make one there: {e.strerror}. Run `numaserve prepare --config FILE` where "
            "the cache is writable, or name the precision (model.backend, model.quantize)"
        )

    return kept_or_made(directory, f"{key}.lock", lambda: _read(kept, pools), made, cannot)


def named_cost(
    config: ModelConfig, isa: tuple[str, ...], pools: tuple[Band, ...], load: Loader, digest: str
) -> dict[str, str]:
    """What a precision the config names costs on this CPU, for each pool: the gate's verdict
    in each band of its lengths, one line for the log, `numaserve status` and /info. It is
    served all the same. Judged once and kept beside the auto choices (a read-only cache
    judges at every prepare). Where the fp32 reference cannot run (no torch, as in the
    container image), a judgement kept for this CPU is read, or the lines say it was not
    judged: the precision is served all the same."""
    from numaserve.backends.artifacts import cache_root

    path = ModelPath(config.backend, config.quantize, config.keep_fp32)
    kept = cache_root() / "choice" / f"named-{named_key(digest, config, isa)}.json"
    try:
        judgement = Judgement.from_json(json.loads(kept.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.info(
            "%s as the config names it: judging it against fp32 on this CPU, to say what it "
            "costs here (once; kept)",
            path,
            extra=PREPARE,
        )
        judged = gate_config(config)
        # Judged once, before any instance of it runs: on a few of this process's CPUs, not one.
        load = partial(load, threads=min(JUDGING_THREADS, len(os.sched_getaffinity(0))))
        try:
            gate = reference_gate(judged, isa, load)
        except MissingRuntime as e:
            log.warning(
                "%s: not judged on this CPU, served as asked: the gate's fp32 reference runs "
                "under torch, which this installation cannot import (%s). "
                "`numaserve prepare` from a full installation on this CPU says what it costs "
                "here (docs/accuracy.md#a-named-precision)",
                path,
                e.__cause__ or e,
                extra=PREPARE,
            )
            unjudged = "served as asked; not judged on this CPU (its fp32 reference needs torch)"
            return {band.pool: unjudged for band in pools}
        judgement = gate.judge(load(judged, isa))
        with contextlib.suppress(OSError):  # a read-only cache: judged again next time
            kept.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(kept, json.dumps(judgement.to_json(), indent=1))
    costs = {}
    for band in pools:
        span = band.span
        failed = [str(k) for k, v in judgement.within(span).items() if not v.passed]
        verdict = (
            f"below the gate's bar on texts of {', '.join(failed)}"
            if failed
            else "within the gate's bars"
        )
        costs[band.pool] = (
            f"served as asked; on this CPU {verdict}: {judgement.figure_within(span)}"
        )
        log.log(
            logging.WARNING if failed else logging.INFO,
            "%s, pool %s: %s",
            path,
            band.pool,
            costs[band.pool],
            extra=PREPARE,
        )
    return costs


def _read(path: Path, pools: tuple[Band, ...]) -> Choice | None:
    """The choice kept at `path`, its pools under these pools' names (it was made for their
    bands, maybe under other names); None where there is none, or it cannot be read."""
    try:
        choice = Choice.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none kept, or a damaged file: made again
    if len(choice.pools) != len(pools):
        return None
    return Choice(
        dict(zip((b.pool for b in pools), choice.pools.values(), strict=True)), choice.trials
    )


def choose(
    config: ModelConfig,
    isa: tuple[str, ...],
    load: Loader,
    texts: list[str] | None = None,
    pools: tuple[Band, ...] | None = None,
    batching: Batching = ALONE,
    verdicts: Path | None = None,
) -> Choice:
    """Build and judge each candidate in each band of lengths (gate.py); then, for each band
    of each pool, race those that pass there (race.py) on the texts of its lengths, as the
    pool runs them; the pool runs each band's winner. `verdicts`: where the gate's verdicts
    are kept, so that another pool layout of the same model on this CPU only races (the gate
    is most of a choice's time)."""
    from numaserve.backends.gate import gate_corpus
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.tasks import TASKS

    pools = pools or (Band("default", 0, config.max_length),)
    config = gate_config(config)
    texts = texts or gate_corpus()
    paths = {str(p): p for p in candidates(config.backend)}
    if (trials := _read_trials(verdicts)) is not None:
        log.info(
            "quantize: auto: the gate's verdicts on %s are kept from an earlier choice; "
            "racing the paths that passed for these pools",
            config.path,
            extra=PREPARE,
        )
        tokenizer = Tokenizer(config.path, config.max_length)
        inputs = TASKS[config.task].gate_inputs(tokenizer, texts)
        judged = {t["path"]: Judgement.from_json(t["bands"]) for t in trials if "bands" in t}
        passed = {
            name: load(paths[name].applied_to(config), isa)
            for name, judgement in judged.items()
            if judgement.passes_any
        }
    else:
        log.info(  # the first line, before the fp32 reference loads (seconds of silence)
            "quantize: auto: choosing the fastest accurate model path of %s for this CPU, "
            "once (kept for later starts): %d model paths built, judged against fp32 and timed, "
            "about a minute and a half for a small model on 2 cores. To skip it, name a precision: "
            "model.quantize in the config, or --quantize with --model",
            config.path,
            len(paths),
            extra=PREPARE,
        )
        builders = start_builders(config, isa)
        gate = reference_gate(config, isa, load, texts)
        log.info(  # once the reference loads: a checkpoint without the task's head fails there
            "quantize: auto: judging and timing each model path of %s on this CPU (once; kept), "
            "against torch fp32, in each band of lengths",
            config.path,
            extra=PREPARE,
        )
        trials, passed, judged = judge(config, isa, load, gate, builders)
        inputs = gate.inputs
        if verdicts is not None:
            write_atomically(verdicts, json.dumps(trials, indent=1))
    if not passed:
        raise ModelLoadError(
            f"quantize: auto: no model path of {config.path} passes the accuracy gate: "
            + _figures(trials)
        )
    trials = [dict(t) for t in trials]  # each race adds its times
    chosen = race_pools(
        pools, batching, inputs, Passed(passed, judged), trials, paths, config.max_paths
    )
    return Choice(chosen, tuple(trials))


@dataclass(frozen=True)
class Passed:
    """The candidates that pass the gate in some band, loaded, and every candidate's
    judgement, by the path's name."""

    models: dict
    judged: dict[str, Judgement]

    def where(self, span: Span) -> list[str]:
        """Those that pass in every band the span overlaps."""
        return [name for name in self.models if self.judged[name].passes(span)]


@dataclass(frozen=True)
class Won:
    """What one band of lengths runs: its latency path (the fastest accurate one text at a
    time) and, where another is faster at the pool's micro-batches, its throughput path."""

    span: Span
    alone: str
    why: str
    batched: BatchedPath | None = None
    through: str | None = None  # the throughput path's name, where it has one

    def runs_as(self, other: Won) -> bool:
        """Whether two neighbouring bands run the same paths, and so run as one."""

        def switch(w: Won) -> tuple | None:
            return w.batched and (w.batched.path, w.batched.from_batch)

        return self.alone == other.alone and switch(self) == switch(other)


def race_pools(
    pools,
    batching: Batching,
    inputs,
    passed: Passed,
    trials: list,
    paths: dict,
    max_paths: int = MAX_PATHS,
) -> dict[str, PoolPath]:
    """Each pool's paths for each band of its lengths: the race among the paths that pass
    there (their times added to `trials`), one text at a time and, apart, at the pool's
    micro-batches. The pool's longest band decides its own path, which then runs ahead in
    the shorter bands' races, so that it wins where it is within the noise of another (one
    model an instance, where it is accurate); likewise a band's latency path runs ahead in
    its micro-batches' race, so that a band holds a second path only where it is clearly
    faster there."""
    clock = RaceClock(_gate_pace(trials, passed.models))
    races: dict[str, list[tuple[SpanRace, list[str]]]] = {}  # by pool, its longest band first
    for band in pools:
        for span in reversed(length_bands(band.span.first, band.span.last)):
            names = passed.where(span)
            if not names:
                raise ModelLoadError(
                    f"quantize: auto: no model path passes the accuracy gate on texts of {span} "
                    f"(pool {band.pool}): {_figures(trials)}"
                )
            race = SpanRace(band, span, batching, inputs, passed, trials, paths, clock)
            race.plan(names)
            races.setdefault(band.pool, []).append((race, names))
    chosen = {}
    for band in pools:
        won: list[Won] = []  # longest first
        for race, names in races[band.pool]:
            won.append(race.run(names, won[0] if won else None))
        choice = _pool_choice(won[::-1], paths, passed.judged)
        chosen[band.pool] = within(choice, max_paths, band.pool)
        _log_choice(band.pool, chosen[band.pool])
    for trial in trials:  # one figure a path, for `numaserve tune`'s ranking: the pools' median
        if times := [p["ms"] for p in trial.get("pools", {}).values()]:
            trial["ms"] = round(statistics.median(times), 3)
    return chosen


def within(choice: PoolPath, max_paths: int, pool: str) -> PoolPath:
    """The choice, its bands' throughput paths kept only while the pool's instances hold
    at most `max_paths` paths (model.max_paths), the pool's own band's first: the paths each
    band needs to be accurate are held whatever the cap (the log says where they exceed it)."""
    held = list(dict.fromkeys(b.path for b in (choice, *choice.shorter)))
    if len(held) > max_paths:
        log.warning(
            "quantize: auto: pool %s holds %d model paths (%s), more than model.max_paths %d: "
            "each is the fastest accurate one for a band of its lengths",
            pool,
            len(held),
            ", ".join(map(str, held)),
            max_paths,
            extra=PREPARE,
        )

    def kept(batched: BatchedPath | None) -> BatchedPath | None:
        if batched is None or batched.path in held:
            return batched
        if len(held) < max_paths:
            held.append(batched.path)
            return batched
        log.info(
            "quantize: auto: pool %s does not hold %s for its micro-batches (%s): "
            "model.max_paths %d",
            pool,
            batched.path,
            batched.why,
            max_paths,
            extra=PREPARE,
        )
        return None

    own = kept(choice.batched)
    shorter: list[BandPath] = []
    for s in (dataclasses.replace(s, batched=kept(s.batched)) for s in choice.shorter):
        if shorter and (shorter[-1].path, shorter[-1].batched) == (s.path, s.batched):
            s = _joined(shorter.pop(), s)  # neighbours that now run alike run as one
        shorter.append(s)
    choice = dataclasses.replace(choice, batched=own)
    if shorter and (shorter[-1].path, shorter[-1].batched) == (choice.path, own):
        last = _joined(shorter.pop(), BandPath(0, choice.path, choice.why, own, choice.accuracy))
        choice = dataclasses.replace(choice, why=last.why, accuracy=last.accuracy)
    return dataclasses.replace(choice, shorter=tuple(shorter))


def _joined(first: BandPath, then: BandPath) -> BandPath:
    """Two neighbouring bands that run the same paths, as one."""
    figures = "; ".join(a for a in (first.accuracy, then.accuracy) if a) or None
    return dataclasses.replace(then, why=f"{first.why}; {then.why}", accuracy=figures)


def _log_choice(pool: str, choice: PoolPath) -> None:
    say = partial(log.info, extra=PREPARE)
    say("quantize: auto: pool %s chose %s: %s", pool, choice.path, choice.why)
    if choice.batched:
        say("quantize: auto: pool %s runs its micro-batches of %s", pool, choice.batched.words())
    for shorter in choice.shorter:
        say(
            "quantize: auto: pool %s runs its texts of up to %d tokens on %s%s: %s",
            pool,
            shorter.last,
            shorter.path,
            f" (micro-batches: {shorter.batched.words()})" if shorter.batched else "",
            shorter.why,
        )


class RaceClock:
    """How long the races have left, said on each race's line: the forward passes and
    tokens they have left to run, at a time a pass of a + b x its tokens fitted to the races
    run so far (their lengths and batch sizes differ: a band of long texts costs 5 times a
    short band's a text, a text costs less in a micro-batch than alone), or before any, at
    the pace the paths ran the gate's texts (`first_pace`, s a token, one text a pass)."""

    def __init__(self, first_pace: float | None) -> None:
        self.first_pace = first_pace
        self.passes = self.tokens = 0  # still to run
        self.runs: list[tuple[int, int, float]] = []  # each race's passes, tokens, seconds

    def plan(self, passes: int, tokens: int) -> None:
        self.passes, self.tokens = self.passes + passes, self.tokens + tokens

    def ran(self, passes: int, tokens: int, seconds: float) -> None:
        self.plan(-passes, -tokens)
        self.runs.append((passes, tokens, seconds))

    def cost(self) -> tuple[float, float] | None:
        """(a, b): s a pass and s a token, by least squares over the races run, neither
        below 0; with too few (or alike) races, all of it a token's."""
        if not self.runs:
            return None if self.first_pace is None else (0.0, self.first_pace)
        pp = sum(p * p for p, _, _ in self.runs)
        pt = sum(p * t for p, t, _ in self.runs)
        tt = sum(t * t for _, t, _ in self.runs)
        ps = sum(p * s for p, _, s in self.runs)
        ts = sum(t * s for _, t, s in self.runs)
        det = pp * tt - pt * pt
        if det > 1e-9 * pp * tt:
            a, b = (ps * tt - ts * pt) / det, (ts * pp - ps * pt) / det
            if a >= 0 and b >= 0:
                return a, b
        return 0.0, sum(s for *_, s in self.runs) / sum(t for _, t, _ in self.runs)

    def words(self) -> str:
        if (cost := self.cost()) is None:
            return ""
        seconds = max(0.0, cost[0] * self.passes + cost[1] * self.tokens)
        return f"; about {seconds:.0f} s left for the races"


def _gate_pace(trials: list[dict], models: dict) -> float | None:
    """The paths that race's median time a token through the gate (judge keeps it)."""
    paces = [t["gate_s_a_token"] for t in trials if t["path"] in models and "gate_s_a_token" in t]
    return statistics.median(paces) if paces else None


LADDER = (2, 4, 8, 16, 32, 64, 128)  # the micro-batch sizes a crossover is looked for at
BATCHES_A_ROUND = 8  # micro-batches each round of a race times, at the least


class SpanRace:
    """The races of one band of one pool's lengths, on the gate's texts of those lengths:
    one text at a time, the pool's micro-batches, and where their winners differ, the batch
    size from which the throughput path leads."""

    def __init__(
        self, band: Band, span: Span, batching: Batching, inputs, passed, trials, paths, clock
    ):
        self.pool, self.span, self.passed, self.trials = band.pool, span, passed, trials
        self.paths = paths  # each name's ModelPath
        self.clock: RaceClock = clock
        self.part = Band(band.pool, span.first - 1, span.last)
        self.inputs = band_inputs(inputs, self.part)
        self.batch = batching.size(statistics.median(len(e.ids) for e in self.inputs))

    def plan(self, names: list[str], sign: int = 1) -> None:
        """Its races' work on the clock: one at a time, the pool's micro-batches, and a
        crossover's sizes (taken off again where none is looked for, or found early)."""
        for batch in {1, self.batch}:
            self.clock.plan(*self.work(len(names), batch, sign))
        self.plan_crossover(self.ladder, sign)

    def work(self, paths: int, batch: int, sign: int = 1) -> tuple[int, int]:
        """The forward passes and tokens `paths` paths run in a race at `batch` texts a pass."""
        inputs = self.enough(batch)
        passes = paths * -(-len(inputs) // batch)
        return sign * passes, sign * paths * sum(len(e.ids) for e in inputs)

    @property
    def ladder(self) -> list[int]:
        """The sizes a crossover is looked for at."""
        return [s for s in LADDER if s < self.batch]

    def plan_crossover(self, sizes: list[int], sign: int = 1) -> None:
        for size in sizes:
            self.clock.plan(*self.work(2, size, sign))

    def run(self, names: list[str], longest: Won | None) -> Won:
        """The band's paths; `longest`: what the pool's longest band won, preferred."""
        alone_first = longest.alone if longest else None
        standings = self.timed(_first(names, alone_first), 1)
        best, fastest = winner(standings)
        self.log_detail(1, best, fastest, standings)
        why = "one at a time, " + self.reason(best, fastest, standings)
        if self.batch == 1:
            return Won(self.span, best.name, why)
        preferred = [best.name, *([longest.batched.path] if longest and longest.batched else [])]
        standings = self.timed(_first(names, *map(str, preferred)), self.batch)
        batched, fastest_batched = winner(standings)
        self.log_detail(self.batch, batched, fastest_batched, standings)
        if batched.name == best.name:
            why += f"; {self.batch} at a time too, " + self.reason(
                batched, fastest_batched, standings
            )
            self.plan_crossover(self.ladder, -1)  # none to look for
            return Won(self.span, best.name, why)
        why += f"; {self.batch} at a time {batched.name} is faster: its micro-batches' path"
        start, crossing = self.crossover(best.name, batched.name)
        latency = next(s for s in standings if s.name == best.name)
        lead = statistics.median(ratios(batched, latency))
        switch = BatchedPath(
            start,
            self.paths[batched.name],
            f"texts of {self.span}: {lead:.2f}x {best.name}'s speed {self.batch} at a time, "
            f"ahead from {start} texts a pass ({crossing})",
        )
        return Won(self.span, best.name, why, switch, batched.name)

    def timed(self, names: list[str], batch: int) -> list[Standing]:
        """The names' times per text at micro-batches of `batch`, kept in their trials."""
        log.info(  # a race takes seconds a band: say which, so that no start goes silent
            "quantize: auto: pool %s, texts of %s: timing %s in turns on %d texts, %s%s",
            self.pool,
            self.span,
            ", ".join(names),
            len(self.inputs),
            f"in micro-batches of {batch}" if batch > 1 else "one at a time",
            self.clock.words(),
            extra=PREPARE,
        )
        models = self.passed.models
        runners = {name: partial(run_in_batches, models[name], batch=batch) for name in names}
        # OpenVINO compiles a kernel for each new shape: it meets every round's first
        shapes = {n for n in names if runtime(self.paths[n].backend).per_shape}
        started = time.monotonic()
        standings = race(runners, self.enough(batch), warm_every_shape=shapes)
        self.clock.ran(*self.work(len(names), batch), time.monotonic() - started)
        key = f"{self.pool} {self.span}" + (f" x{batch}" if batch > 1 else "")
        for standing in standings:
            trial = next(t for t in self.trials if t["path"] == standing.name)
            trial.setdefault("pools", {})[key] = {
                "ms": round(standing.median, 3),
                "rounds": [round(x, 3) for x in standing.ms],
            }
        return standings

    def enough(self, batch: int) -> list:
        """The band's inputs, repeated where a round would not fill BATCHES_A_ROUND
        micro-batches of `batch` (a round runs every ROUNDS-th of them), shortest first as
        before: a round of two or three passes is too noisy to call a lead."""
        times = -(-BATCHES_A_ROUND * ROUNDS * batch // len(self.inputs))
        return sorted(self.inputs * times, key=lambda e: len(e.ids)) if times > 1 else self.inputs

    def crossover(self, alone: str, batched: str) -> tuple[int, str]:
        """The smallest micro-batch at which the throughput path is faster a text than the
        latency path, looked for at the sizes below the pool's (the pool's own, where it
        leads at none), and each size's ratio, for the record."""
        seen = []
        sizes = self.ladder
        for n, size in enumerate(sizes):
            a, b = self.timed([alone, batched], size)
            lead = statistics.median(ratios(b, a))
            seen.append(f"{size}: {lead:.2f}x")
            if lead > 1:
                self.plan_crossover(sizes[n + 1 :], -1)
                return size, ", ".join(seen)
        return self.batch, ", ".join(seen) or f"{self.batch}: measured above"

    def reason(self, best: Standing, fastest: Standing, standings) -> str:
        """Why `best` won, in words a user reads once (the log has the detail)."""
        rivals = [s for s in standings if s is not best]
        if not rivals:
            return "the only path that passes the gate"
        if best is fastest:
            second = min(rivals, key=lambda s: s.median)
            return f"{statistics.median(ratios(best, second)):.2f}x {second.name}'s speed"
        return f"as fast as {fastest.name} within the rounds' noise"

    def log_detail(self, batch: int, best: Standing, fastest: Standing, standings) -> None:
        """The race's result in full: the winner's speed, its lead round by round (or why a
        faster one lost), and its accuracy in the gate's bands the band overlaps."""
        where = f"texts of {self.span}, " + ("one at a time" if batch == 1 else f"{batch} a batch")
        rivals = [s for s in standings if s is not best]
        if best is fastest:
            line = f"{best.name}, the fastest that passes the gate on {where}: "
            line += f"{best.median:.2f} ms a text"
            if rivals:
                second = min(rivals, key=lambda s: s.median)
                r = ratios(best, second)
                line += f", {min(r):.2f}-{max(r):.2f}x {second.name}'s round by round"
                line += f" ({len(r)} rounds)"
        else:
            r = ratios(fastest, best)
            line = (
                f"{best.name}, which passes the gate and runs ahead of {fastest.name}, whose "
                f"lead on {where} is within the rounds' noise ({best.median:.2f} against "
                f"{fastest.median:.2f} ms a text, {min(r):.2f}-{max(r):.2f}x round by round)"
            )
        figure = self.passed.judged[best.name].figure_within(self.part.span)
        log.info("quantize: auto: pool %s won by %s; %s", self.pool, line, figure, extra=PREPARE)


def _first(names: list[str], *preferred: str | None) -> list[str]:
    """`names` with those `preferred` that are among them first, in that order."""
    ahead = [p for p in dict.fromkeys(preferred) if p in names]
    return [*ahead, *(n for n in names if n not in ahead)]


def _pool_choice(won: list[Won], paths: dict, judged: dict[str, Judgement]) -> PoolPath:
    """A pool's bands' paths, shortest first, as its own (the longest band's) and the
    shorter runs of bands that run others (neighbours that run the same run as one), each
    path with the gate's figures in every band of the lengths it runs."""
    runs: list[tuple[int, Won]] = []  # (first tokens, the run's longest band's Won)
    for w in won:
        if runs and runs[-1][1].runs_as(w):
            runs[-1] = (runs[-1][0], w)
        else:
            runs.append((w.span.first, w))

    def figures(name: str, first: int, w: Won) -> str | None:
        return judged[name].figure_within(Span(first, w.span.last)) or None

    def batched(first: int, w: Won) -> BatchedPath | None:
        return w.batched and dataclasses.replace(w.batched, accuracy=figures(w.through, first, w))

    def why(first: int, w: Won) -> str:
        """The lengths a run serves, and why its path won (its longest band's race)."""
        if first == w.span.first:
            return f"texts of {w.span}: {w.why}"
        return f"texts of {first}-{w.span.last} tokens, each band raced; {w.span}: {w.why}"

    *rest, (first, main) = runs
    shorter = tuple(
        BandPath(w.span.last, paths[w.alone], why(a, w), batched(a, w), figures(w.alone, a, w))
        for a, w in rest
    )
    return PoolPath(
        paths[main.alone],
        why(first, main),
        shorter,
        batched(first, main),
        figures(main.alone, first, main),
    )


def reference_gate(config: ModelConfig, isa, load: Loader, texts: list[str] | None = None):
    """The gate for config's checkpoint, task and settings (gate_config's), with the fp32
    reference's answers, on `texts` or the gate's own."""
    from numaserve.backends.gate import Gate, gate_corpus
    from numaserve.backends.tokenizer import Tokenizer

    reference = load(REFERENCE.applied_to(config), isa)
    tokenizer = Tokenizer(config.path, config.max_length)
    return Gate(config.task, tokenizer, texts or gate_corpus(), reference)


def _figures(trials: list[dict]) -> str:
    """Each candidate's figure, or why it was skipped, for an error."""
    return "; ".join(f"{t['path']}: {t.get('figure') or t.get('skipped')}" for t in trials)


def _read_trials(path: Path | None) -> list[dict] | None:
    """The gate's kept verdicts; None where none are kept (or the file is damaged)."""
    try:
        trials = json.loads(path.read_text()) if path else None
        return trials if isinstance(trials, list) and all("path" in t for t in trials) else None
    except (OSError, ValueError, TypeError):
        return None


# Accurate paths measured faster than fp32 at every length and batch size (MiniLM: int16
# 1.6-1.9x ONNX Runtime fp32, bf16 on AMX 1.3-2.2x; docs/benchmarks.md#model-paths): where
# they pass the gate in every band, no band runs fp32, which is then neither built nor judged.
FASTER_THAN_FP32 = {"ctranslate2 int16": (), "openvino bf16": ("amx_bf16",)}


def judging_order(paths: list[ModelPath]) -> list[ModelPath]:
    """fp32's paths last: judged only where needed (FASTER_THAN_FP32)."""
    return sorted(paths, key=lambda p: p.quantize == "none" and p != REFERENCE)


def start_builders(config: ModelConfig, isa) -> list[threading.Thread]:
    """Two threads building the candidates' artifacts in judging order, each through a child
    process at a time, started before the fp32 reference loads (10 s for MiniLM): the
    judging, which finds each artifact kept once built, mostly waits on them."""
    configs = [p.applied_to(config) for p in judging_order(candidates(config.backend))]
    builders = [
        threading.Thread(target=_build_ahead, args=(configs[i::2], isa), daemon=True)
        for i in range(2)
    ]
    for builder in builders:
        builder.start()
    return builders


def judge(
    config: ModelConfig, isa, load: Loader, gate, builders: list[threading.Thread] = ()
) -> tuple[list[dict], dict, dict]:
    """Each candidate's judgement (a trial each, in CANDIDATES' order), the models that pass
    in some band, kept loaded, and the judgements by path. fp32's paths are judged last, and
    only where some band has no accurate path known to be faster (FASTER_THAN_FP32). While
    one candidate is judged, `builders` (start_builders) build the next ones' artifacts."""
    paths = candidates(config.backend)
    order = judging_order(paths)
    trials, passed, judged = {}, {}, {}
    judging, count = 0.0, 0  # seconds spent on the candidates built and judged, and how many
    for number, path in enumerate(order, 1):
        trial = trials[str(path)] = {"path": str(path)}
        if path.quantize == "none" and (faster := covered_without_fp32(judged, gate.bands, isa)):
            trial["skipped"] = f"not needed: {faster} passes the gate in every band, faster"
            log.info("quantize: auto: %s skipped, %s", path, trial["skipped"], extra=PREPARE)
            continue
        log.info(  # a first start spends up to half a minute on one: say which, and how long
            "quantize: auto: candidate %d of %d, %s: building and judging it%s",
            number,
            len(paths),
            path,
            _time_left(judging, count, len(paths) - number + 1),
            extra=PREPARE,
        )
        began = time.monotonic()
        try:
            model = load(path.applied_to(config), isa)
        except ModelLoadError as e:
            trial["skipped"] = str(e)
            log.info("quantize: auto: %s skipped: %s", path, e, extra=PREPARE)
            continue
        gate_started = time.monotonic()
        judgement = gate.judge(model)
        judged_s = time.monotonic() - gate_started
        judging, count = judging + time.monotonic() - began, count + 1
        trial |= {
            "passed": judgement.passed,
            "figure": judgement.figure,
            "bands": judgement.to_json(),
            # the races' first pace (RaceClock)
            "gate_s_a_token": judged_s / sum(len(e.ids) for e in gate.inputs),
        }
        judged[str(path)] = judgement
        if judgement.passes_any:
            passed[str(path)] = model
        failed = [str(span) for span, v in judgement.bands.items() if not v.passed]
        log.info(
            "quantize: auto: candidate %d of %d, %s, %s (%s)",
            number,
            len(paths),
            path,
            f"fails the gate on texts of {', '.join(failed)}" if failed else "passes the gate",
            judgement.figure,
            extra=PREPARE,
        )
    for builder in builders:
        builder.join()
    names = [str(p) for p in paths]  # races list them in CANDIDATES' order: less memory first
    return [trials[n] for n in names], {n: passed[n] for n in names if n in passed}, judged


def covered_without_fp32(judged: dict[str, Judgement], bands, isa) -> str | None:
    """Which of FASTER_THAN_FP32 pass the gate in every band, joined; None where some band
    has none of them."""
    faster = [p for p, needs in FASTER_THAN_FP32.items() if all(n in isa for n in needs)]
    found = [p for p in faster if p in judged]
    every = all(any(judged[p].passes(span) for p in found) for span in bands)
    return " or ".join(found) if found and every else None


def _build_ahead(configs: list[ModelConfig], isa) -> None:
    """Each candidate's artifact, built in turn (a child process builds each) and kept, so
    that judging it finds it: run beside the judging. One that cannot be built is left to
    the judging, which says why; fp32's, which may not be needed, last."""
    from numaserve.backends.building import artifact

    for config in configs:
        try:
            artifact(config, isa)
        except (ModelLoadError, OSError):
            continue


def _time_left(spent: float, judged: int, left: int) -> str:
    """ "; about N s left" for the `left` candidates, at the pace of those built and judged so
    far (one that could not be built, skipped at once, says nothing of the others' pace)."""
    if not judged:
        return ""
    return f"; about {spent / judged * left:.0f} s left for the candidates, then the races"


def band_inputs(inputs: list, band: Band) -> list:
    """The gate's inputs of the band's lengths (RACE_INPUTS of them at most, spread over its
    lengths by rank), or the BAND_INPUTS nearest to it."""
    inside = sorted((e for e in inputs if band.holds(len(e.ids))), key=lambda e: len(e.ids))
    if len(inside) > RACE_INPUTS:
        step = len(inside) / RACE_INPUTS
        return [inside[int(i * step)] for i in range(RACE_INPUTS)]
    if len(inside) >= BAND_INPUTS:
        return inside
    nearest = sorted(inputs, key=lambda e: (band.distance(len(e.ids)), len(e.ids)))
    return sorted(nearest[:BAND_INPUTS], key=lambda e: len(e.ids))


def gate_config(config: ModelConfig) -> ModelConfig:
    """The settings the gate runs with, whatever the config's: one choice serves every
    max_length and padding (batch 1 pads nothing), and its texts reach GATE_MAX_TOKENS."""
    from numaserve.backends.base import ModelFacts

    positions = ModelFacts.read(resolve_model_path(config.path)).max_positions
    tokens = min(GATE_MAX_TOKENS, positions or GATE_MAX_TOKENS)
    return dataclasses.replace(config, max_length=tokens, padding="dynamic", truncate=True)
