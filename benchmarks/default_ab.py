"""Is the default server as fast as at an earlier commit? Both, alternating, in one run.

The default config (`bundled:minilm`, embed, `quantize: auto`, every core; only the
endpoint set) is started with `numaserve start` from this checkout and from a git worktree of --old,
in turns, ABBA (old, new, new, old, old, new, ...) so that neither always goes first, and
loaded each time with `numaserve bench` (closed loop,
stdlib sentences, after a warm-up); its start time is from `numaserve start` to every instance
ready, compared from the second round on (the first side of the first round chooses). The worktree's code is run by putting it first on
PYTHONPATH, with this venv's packages, each side's processes started in a directory of its
own (`python -c` puts the working directory ahead of PYTHONPATH: from this checkout both
sides ran its code, until 2026-12-06; it checks now). Prints each round and the median ratio new/old of
throughput, p50 latency and the server's CPU time a request (its processes' user and system
time over the measured load, /proc): on a noisy VM only ratios within one run mean anything,
and the CPU time a request moves least with the neighbours.

With `--collector`, the new side exports its traces to an OTLP receiver in this process
(numaserve/testing/otlp.py), with `--new-env` saying the rest (OTEL_TRACES_SAMPLER_ARG=0.01):
what tracing costs the same server. The receiver keeps what it is sent and decodes it after
the last round (`--decoding-collector`: as it comes, on the machine being measured, as a
collector on the same host would).

Run:  .venv/bin/python -m benchmarks.default_ab --old REV [--rounds 3] [--clients 8]
          [--requests 300] [--cache-off] [--collector | --decoding-collector]
          [--new-env KEY=VALUE ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from numaserve.host.topology import read_topology
from numaserve.testing.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def all_ready(numaserve: list[str], endpoint: str, env: dict, cwd: Path) -> bool:
    status = subprocess.run(
        [*numaserve, "status", "--endpoint", endpoint, "--timeout", "1", "--json"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if status.returncode:
        return False
    instances = json.loads(status.stdout)["instances"]
    return bool(instances) and all(i["state"] == "ready" for i in instances)


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) of the server's processes so far: the supervisor, its
    shards and instances. Unlike throughput on a shared machine, the work a request costs
    does not move with what else runs."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def runs_from(tree: Path, env: dict, cwd: Path) -> Path:
    """Where `numaserve` imports from, run as the servers are: `python -c` puts the working
    directory first on sys.path, ahead of PYTHONPATH, so run from this checkout both sides
    would run its code."""
    where = subprocess.run(
        [sys.executable, "-c", "import numaserve; print(numaserve.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(where).resolve().parents[1]


def serve_and_load(tree: Path, args, work: Path, extra_env: dict) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = work / "default.yaml"
    cache = ", cache_entries: 0" if args.cache_off else ""
    config.write_text(f"server: {{endpoint: '{endpoint}'{cache}}}\n")
    # One ONNX cache for both trees: the artifact's key is the same, so it is built once.
    env = {**os.environ, "PYTHONPATH": str(tree), "NUMASERVE_CACHE": str(work.parent / "cache")}
    env |= extra_env
    if runs_from(tree, env, work) != tree.resolve():
        raise RuntimeError(f"{tree}'s side would import numaserve from elsewhere")
    numaserve = [sys.executable, "-c", "from numaserve.cli import main; main()"]
    log = (work / "server.log").open("a")
    launched = time.monotonic()
    server = subprocess.Popen(  # run from `work`: see runs_from
        [*numaserve, "start", "--config", str(config)], stdout=log, stderr=log, env=env, cwd=work
    )
    try:
        deadline = time.monotonic() + 600
        while not all_ready(numaserve, endpoint, env, work):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the server did not start; see {work / 'server.log'}")
            time.sleep(0.2)
        start_s = time.monotonic() - launched  # to every instance ready (its choice kept)
        bench = [*numaserve, "bench", "--endpoint", endpoint, "--json"]
        subprocess.run(
            [*bench, "--clients", "2", "--requests", "50"],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
        )  # warm every instance and the path
        before = cpu_seconds(server.pid)
        out = subprocess.run(
            [*bench, "--clients", str(args.clients), "--requests", str(args.requests)],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        summary = json.loads(out)
        spent = cpu_seconds(server.pid) - before
        summary["server_cpu_ms_per_request"] = 1000 * spent / summary["requests"]
        summary["start_s"] = start_s
        return summary
    finally:
        server.terminate()
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300, help="per client")
    parser.add_argument(
        "--cache-off", action="store_true", help="server.cache_entries: 0: every request runs"
    )
    parser.add_argument(
        "--collector", action="store_true", help="the new side traces to a receiver here"
    )
    parser.add_argument(
        "--decoding-collector", action="store_true", help="... which decodes as spans come"
    )
    parser.add_argument("--new-env", action="append", default=[], help="KEY=VALUE, new side")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    new_env = dict(pair.split("=", 1) for pair in args.new_env)
    receiver = None
    if args.collector or args.decoding_collector:
        from numaserve.testing.otlp import HttpReceiver

        receiver = HttpReceiver(lazy=not args.decoding_collector)
        new_env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    print(f"new side's environment: {new_env or 'as the old'}")
    topo = read_topology()
    print(
        f"{len(topo.allowed_cpus)} CPUs; ISA {' '.join(topo.isa)}; old {args.old}, new: this checkout"
    )
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), args.old],
            check=True,
        )
        try:
            rounds = []
            for n in range(args.rounds):
                order = (("old", old), ("new", ROOT))
                for name, tree in order if n % 2 == 0 else order[::-1]:
                    work = Path(tmp) / f"{name}{n}"
                    work.mkdir()
                    summary = serve_and_load(tree, args, work, new_env if name == "new" else {})
                    rounds.append({"tree": name, "round": n, **summary})
                    print(
                        f"round {n} {name}: {summary['throughput_rps']:.1f} req/s, "
                        f"p50 {summary['latency_ms']['p50']:.2f} ms, "
                        f"p99 {summary['latency_ms']['p99']:.2f} ms, errors {summary['errors']}, "
                        f"server CPU {summary['server_cpu_ms_per_request']:.3f} ms a request, "
                        f"started in {summary['start_s']:.1f} s"
                    )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)])
    pairs = [
        tuple(sorted(rounds[i : i + 2], key=lambda r: r["tree"] != "old"))
        for i in range(0, len(rounds), 2)
    ]
    throughput = statistics.median(n["throughput_rps"] / o["throughput_rps"] for o, n in pairs)
    p50 = statistics.median(n["latency_ms"]["p50"] / o["latency_ms"]["p50"] for o, n in pairs)
    cpu = statistics.median(
        n["server_cpu_ms_per_request"] / o["server_cpu_ms_per_request"] for o, n in pairs
    )
    # the first round's first side chooses and builds (the cache is new): its start is not one
    start = statistics.median(n["start_s"] / o["start_s"] for o, n in pairs[1:] or pairs)
    print(
        f"new/old, median of {len(pairs)} pairs: throughput {throughput:.3f}x, p50 {p50:.3f}x, "
        f"server CPU a request {cpu:.3f}x, start time {start:.3f}x"
    )
    result = {"old": args.old, "new_env": new_env, "rounds": rounds}
    if receiver is not None:
        receiver.received.decode_kept()
        result["spans_received"] = len(receiver.received.spans)
        print(f"spans received: {result['spans_received']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
