"""One `numaserve tune` run: the workload, the model paths, the curves (measured), the search,
then the best few and the config as given verified as real servers, within the time budget.
The OS-facing parts (probes, servers) stop on any exit: each sits in a `finally`."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from numaserve.backends.choice import Batching, ensure_choice, named
from numaserve.backends.race import in_turn
from numaserve.config.paths import ModelPath, PoolPath
from numaserve.config.runtimes import runtime
from numaserve.config.schema import Config, PoolConfig, load_config
from numaserve.host.cpuset import CPUSet
from numaserve.host.ledger import Ledger, ledger_dir, plan_around, without
from numaserve.host.placement import PlacementError
from numaserve.host.topology import CPUTopology
from numaserve.tune.curves import Curves, composed
from numaserve.tune.measure import Job, measure, rounds
from numaserve.tune.report import comment, table, winner
from numaserve.tune.search import Candidate, Pool, Prediction, Predictor, search, to_verify
from numaserve.tune.tuned import as_given_mapping, tuned_mapping, tuned_text, verification_text
from numaserve.tune.verify import ROUNDS, Step, Verified, ladder, verify
from numaserve.tune.workload import Workload, read_workload

LENGTHS = (16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16, 32)
MAX_CORES_PER_INSTANCE = 8
AUTO = "auto"  # the label of quantize: auto's paths, composed by band and batch size
VERIFIED = 2  # candidates verified beside the config as given (at least one a model path)
MEASURE_SHARE = 0.4  # of the time budget
LOAD_S = 20.0  # what a probe's model load and warm-up are allowed for, in the budget
SERVER_START_S = 30.0  # a verification server's start, in the budget
MIN_STEP_S = 3.0  # the shortest step of a verification's load ladder


class TuneError(RuntimeError):
    """Tune cannot run here, or cannot measure: the message says why and what to do."""


class NoCoresError(TuneError):
    """Other servers (or the config's reserved cores) leave no core to measure on."""


class NoModelError(TuneError):
    """The model does not load as a path tune would measure."""


@dataclass
class Tuning:
    config: Config
    raw: dict
    topo: CPUTopology
    ledger: Ledger | None
    workload: Workload
    cores: int  # for instances: free physical cores less the config's reserved ones
    paths: dict[str, ModelPath]  # what is measured
    choice: PoolPath | None = None  # quantize: auto's, whose paths are measured

    @property
    def served(self) -> dict[str, ModelPath]:
        """What a tuned config may run, by label: each path measured, or under `quantize:
        auto`, auto itself (AUTO): its paths by band and batch size, composed, as it serves."""
        return {AUTO: ModelPath("auto", "auto")} if self.choice else self.paths

    def searched(self, curves: Curves) -> Curves:
        """The curves the search ranks: each path's, or auto's, composed from its paths'."""
        if self.choice is None:
            return curves
        return composed(curves, AUTO, lambda n, b: str(self.choice.runs(n, b)))


def setup(config_path: str, texts: list[str], topo: CPUTopology, say) -> Tuning:
    config = load_config(config_path)
    if config.named:
        raise TuneError(f"{config.source}: tune tunes a `model:` config; this one has `models:`")
    if config.model.task == "rerank":
        raise TuneError("tune measures single texts; a rerank model's pairs are not tuned yet")
    raw = yaml.safe_load(Path(config_path).read_text()) or {}
    directory = ledger_dir()
    ledger = Ledger(directory) if directory else None
    free = free_cores(topo, ledger)
    cores = free - config.placement.reserved_cores
    if cores < 1:
        raise NoCoresError(
            f"no core free to measure on: {free} physical core(s) free of other servers "
            f"(ledger {directory}), {config.placement.reserved_cores} reserved by the config"
        )
    workload = read_workload(texts, config.model.path, config.model.max_length)
    say(f"workload: {workload.describe()}")
    return Tuning(config, raw, topo, ledger, workload, cores, *model_paths(config, topo, say))


def free_cores(topo: CPUTopology, ledger: Ledger | None) -> int:
    """Physical cores with a CPU no other server holds (servers hold whole cores)."""
    free = without(topo, ledger.holders() if ledger else [])
    return sum(1 for c in free.cores if free.allowed_cpus & CPUSet(c.cpus))


def model_paths(
    config: Config, topo: CPUTopology, say
) -> tuple[dict[str, ModelPath], PoolPath | None]:
    """The model paths to measure, each prepared: the config's own, or with `quantize: auto`,
    every path its choice holds for one pool over every length at the config's batching
    (the choice is made first, if need be), with that choice."""
    from numaserve.backends import load_model, prepare_model

    model, choice = config.model, None
    if model.quantize != "auto":
        concrete_model = named(model)
        names = [ModelPath(concrete_model.backend, concrete_model.quantize, model.keep_fp32)]
    else:
        batching = Batching(config.server.max_batch, config.server.max_batch_tokens)
        choice = ensure_choice(model, topo.isa, load_model, batching=batching).for_pool()
        names = list(choice.held)
    paths = {}
    for path in names:
        say(f"preparing {path}")
        if not prepare_model(path.applied_to(model), topo.isa):
            raise NoModelError(f"the model does not load as {path} (the log above says why)")
        paths[str(path)] = path
    return paths, choice


def measure_curves(t: Tuning, seconds: float, progress):
    widest = max((len(t.topo.cores_in_node(n.id)) for n in t.topo.nodes), default=t.cores)
    ks = [k for k in (1, 2, 4, 8) if k <= min(t.cores, widest, MAX_CORES_PER_INSTANCE)]
    jobs = [Job(label, p.applied_to(t.config.model), k) for label, p in t.paths.items() for k in ks]
    lengths = measured_lengths(t.workload.lengths[-1][0], t.config.model.max_length)
    count = len(rounds(jobs, t.topo, t.ledger))
    each = max(10.0, seconds / count - LOAD_S)
    return measure(jobs, t.topo, t.ledger, lengths, BATCHES, each, progress)


def kept_shapes(t: Tuning) -> dict[str, int]:
    """The input shapes each label's runtime keeps compiled: OpenVINO's cache (auto's where
    one of its paths is OpenVINO's); ONNX Runtime, CTranslate2 and torch run any shape alike."""
    from numaserve.backends.openvino import RUNTIME_CACHE_SHAPES

    def compiles(label: str) -> bool:
        paths = t.paths.values() if label == AUTO else [t.served[label]]
        return any(runtime(p.backend).per_shape for p in paths)

    if RUNTIME_CACHE_SHAPES is None:
        return {}
    return {label: RUNTIME_CACHE_SHAPES for label in t.served if compiles(label)}


def measured_lengths(longest_text: int, max_length: int) -> tuple[int, ...]:
    """The grid up to the first length past the longest text padded (1.25x), within
    max_length: a batch's time is interpolated between these."""
    longest = min(max_length, int(longest_text * 1.25) + 1)
    beyond = min(max_length, next((n for n in LENGTHS if n >= longest), longest))
    return (*(n for n in LENGTHS if n < beyond), beyond)


def plans(t: Tuning, c: Candidate) -> bool:
    pools = tuple(
        PoolConfig(
            name=f"p{i}", max_tokens=p.max_tokens, cores_per_instance=p.cores, instances=p.instances
        )
        for i, p in enumerate(c.pools)
    )
    placement = dataclasses.replace(t.config.placement, pools=pools)
    try:
        plan_around(t.ledger, t.topo, placement)
    except PlacementError:
        return False
    return True


def as_given(t: Tuning, predictor: Predictor) -> tuple[int, Prediction | None]:
    """The config as given: its instance count, and what the curves predict for it. A
    PlacementError where it does not plan on the cores free here."""
    _, plan, _ = plan_around(t.ledger, t.topo, t.config.placement)
    label = next(iter(t.served))  # the config's own path, or auto
    by_pool = {}
    for slot in plan.slots:
        by_pool.setdefault(slot.pool, []).append(slot)
    pools = tuple(
        Pool(p.max_tokens, len(by_pool[p.name][0].cpus), len(by_pool[p.name]))
        for p in sorted(t.config.placement.pools, key=lambda p: p.max_tokens)
        if p.name in by_pool
    )
    server = t.config.server
    given = Candidate(label, pools, server.max_batch, server.max_batch_tokens)
    try:
        return len(plan.slots), predictor.predict(given)
    except KeyError:  # a cores-per-instance not measured
        return len(plan.slots), None


def verify_all(t: Tuning, ranked: list[Prediction], predictor, p99_ms, deadline, texts, say):
    """The config as given and the candidates to_verify picks, each as a real server, in
    rounds within the time left: rows of (label, candidate or None, prediction, Verified)."""
    chosen = to_verify(ranked, VERIFIED, lambda c: plans(t, c))
    rows, runs = [], []
    try:
        instances, given = as_given(t, predictor)
        text = verification_text(as_given_mapping(t.raw, t.config))
        runs.append(("given", None, given, text, instances))
    except PlacementError as e:
        rows.append(("given", None, None, Verified("given", (), f"does not plan here: {e}")))
    for i, p in enumerate(chosen):
        mapping = tuned_mapping(t.raw, t.config, p.candidate, t.served[p.candidate.path])
        count = sum(q.instances for q in p.candidate.pools)
        runs.append((f"tuned{i + 1}", p.candidate, p, verification_text(mapping), count))
    # Each run: a server start and its ladder, then ROUNDS - 1 starts of one step each.
    steps = len(ladder(1)) + ROUNDS - 1
    each = (deadline - time.monotonic()) / len(runs) - ROUNDS * SERVER_START_S
    step = max(MIN_STEP_S, each / steps)
    ledger = t.ledger.directory if t.ledger else None
    measured = {}
    with tempfile.TemporaryDirectory(prefix="numaserve-tune-") as d:

        def run(label: str, text: str, clients: list[int], ends: float) -> Verified:
            task = t.config.model.task
            return verify(label, text, Path(d), texts, task, clients, p99_ms, step, ends, ledger)

        began = time.monotonic()
        ladders = (deadline - began) * len(ladder(1)) / steps  # the rest: the later rounds
        for i, (label, candidate, _, text, count) in enumerate(runs):
            shape = candidate.describe() if candidate else "the config as given"
            say(f"verifying {label} as a real server: {shape}")
            ends = began + ladders * (i + 1) / len(runs)
            measured[label] = run(label, text, ladder(count), ends)
        racing = [r for r in runs if measured[r[0]].best(p99_ms)]
        a_round = sum(measured[r[0]].start_s + step for r in racing)
        for n in range(1, ROUNDS if len(racing) > 1 else 1):
            if time.monotonic() + a_round > deadline:
                say(f"no time left for round {n + 1} of {ROUNDS}: run with more --minutes")
                break
            for label, _, _, text, _ in in_turn(racing, n):
                best = measured[label].best(p99_ms)
                say(f"round {n + 1} of {ROUNDS}: {label} again, {best.clients} clients")
                again = run(label, text, [best.clients], deadline).steps[:1]
                failed = (Step(best.clients, 0.0, math.inf, 1),)  # a server that did not start
                v = measured[label]
                measured[label] = dataclasses.replace(v, again=v.again + (again or failed))
    rows += [(label, c, p, measured[label]) for label, c, p, _, _ in runs]
    return rows


class Progress:
    """What the probes report, said as it comes."""

    def __init__(self, say) -> None:
        self.say = say

    def started(self, job: Job, slot) -> None:
        self.say(f"measuring {job.path} on {job.cores} core(s): {slot.binding}")

    def cell(self, cell) -> None:
        self.say(
            f"  {cell.path}, {cell.cores} core(s): {cell.batch} x {cell.length} tokens: "
            f"{cell.seconds * 1000:.2f} ms warm, {cell.cold_seconds * 1000:.2f} ms cold"
        )


@dataclass(frozen=True)
class Outcome:
    out: Path
    table: str
    chosen: str  # which verified configuration the file holds, in words
    rows: tuple  # (label, candidate, prediction, Verified)


def tune(
    config_path: str,
    texts: list[str],
    topo: CPUTopology,
    p99_ms: float,
    minutes: float,
    out: Path,
    say,
) -> Outcome:
    deadline = time.monotonic() + minutes * 60
    t = setup(config_path, texts, topo, say)
    say(f"{t.cores} core(s) for instances; model paths: {', '.join(t.paths)}")
    measure_s = (deadline - time.monotonic()) * MEASURE_SHARE
    curves = t.searched(measure_curves(t, measure_s, Progress(say)))
    predictor = Predictor(t.workload, curves, kept_shapes(t))
    ranked = search(predictor, t.cores, p99_ms)
    say(
        f"searched {len(ranked)} configurations; the best predicted: "
        f"{ranked[0].candidate.describe()}, {ranked[0].texts_per_s:.1f} texts/s, "
        f"p99 {ranked[0].p99_ms:.1f} ms"
    )
    rows = verify_all(t, ranked, predictor, p99_ms, deadline, texts, say)
    printed = table(rows, p99_ms)
    best = winner([r[3] for r in rows], p99_ms)
    row = next((r for r in rows if r[3] is best), rows[0])
    label, candidate = row[0], row[1]
    if candidate is None:
        mapping = as_given_mapping(t.raw, t.config)
        chosen = (
            "the config as given: no configuration tried served more within the target "
            "by a lead larger than its spread from round to round"
            if best
            else "the config as given: nothing tried met the p99 target"
        )
    else:
        mapping = tuned_mapping(t.raw, t.config, candidate, t.served[candidate.path])
        chosen = f"{label}, {candidate.describe()}"
    facts = [
        f"Machine: {t.cores} core(s) for instances; ISA {' '.join(topo.isa) or 'unknown'}.",
        f"Workload: {t.workload.describe()}.",
        f"Target: p99 <= {p99_ms:g} ms. Source config: {t.config.source}.",
    ]
    out.write_text(tuned_text(mapping, comment(facts, printed, chosen)))
    load_config(out)  # what it wrote must load: a mistake here is ours, and loud
    return Outcome(out, printed, chosen, tuple(rows))
