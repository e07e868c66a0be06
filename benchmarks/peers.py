"""numaserve against its peers: same model, machine, load and load generator, in one run.

  numaserve        `numaserve start` with configs/default.yaml (one pinned single-core instance
                   per core, the model path `quantize: auto` chooses for this CPU,
                   micro-batching under load), cache off: the peers have none, and cache
                   hits would flatter us
  numaserve-batch-1  the same with micro-batching off (max_batch 1)
  numaserve-http   the same server driven over its HTTP API (TEI's POST /embed), as the peers
  infinity         infinity-emb 0.0.78, its optimum (ONNX Runtime) engine and dynamic batching,
                   on numaserve's own ONNX artifact (the same int8 model file)
  torchserve       TorchServe 0.12 with its CPU launcher (one numactl-pinned worker per core),
                   ONNX Runtime on the same artifact (benchmarks/peer_apps/torchserve_handler.py)
  fastapi          the published "serve BERT with FastAPI on CPU" setup: gunicorn + uvicorn
                   workers = cores, torch int8, one thread (benchmarks/peer_apps/fastapi_app.py)
  ray              Ray Serve, one replica per core, torch int8 (benchmarks/peer_apps/ray_app.py)

Each server is checked against the fp32 model computed in-process (cosine of its embeddings),
so that all are seen to do the same work, then driven by `numaserve bench`'s closed loop (HTTP
for the peers) at each client count, on short texts (stdlib sentences) and mixed ones (1 to 16
of them). Each round also runs the ceiling: the model alone, one process per CPU at batch 1 on
the same texts, no server. Every server runs on every allowed CPU; so do the load generator
and the ceiling, one after the other.

Run:  .venv/bin/python -m benchmarks.peers [--clients 1,8,32,128] [--requests 2000] [--rounds 2]
          [--systems numaserve,infinity,...] [--traffic short,mixed] [--json out.json]
Needs the bench extra (pip install -c constraints.txt -e '.[bench]') for fastapi and ray, and
benchmarks/peer_apps/install.sh for infinity and torchserve (their own environments, .peers/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from benchmarks.instance_scaling import raw
from benchmarks.peer_apps.minilm import Embedder, cosine
from numaserve.backends.onnx_build import artifact_for
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import Client
from numaserve.config.schema import ModelConfig, load_config
from numaserve.corpus import stdlib_sentences
from numaserve.host.topology import format_topology, read_topology
from numaserve.loadgen.bench import closed_loop, http_target, numaserve_target
from numaserve.testing.ports import free_port
from numaserve.testing.server import ENDPOINT, Server

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / ".peers"  # the peers' own environments: benchmarks/peer_apps/install.sh
# No peer phones home from the benchmark (infinity-emb ships posthog; the hub is not there).
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "ORT_DISABLE_TELEMETRY": "1",
}


def tree(root_pid: int) -> list[psutil.Process]:
    """The server's processes: the one we started and all its descendants."""
    root = psutil.Process(root_pid)
    return [root, *root.children(recursive=True)]


def memory(root_pid: int) -> dict:
    """RSS of each process in the server's tree, and the tree's total PSS (shared pages
    such as torch's libraries counted once, split between the processes that map them)."""
    procs = tree(root_pid)
    full = [p.memory_full_info() for p in procs]
    return {
        "processes": len(procs),
        "rss_mb": sorted(round(m.rss / 2**20, 1) for m in full),
        "total_rss_mb": round(sum(m.rss for m in full) / 2**20, 1),
        "total_pss_mb": round(sum(m.pss for m in full) / 2**20, 1),
    }


def cpu_seconds(root_pid: int) -> dict[tuple[int, str], float]:
    """CPU time (user and system) of each process in the server's tree, by (pid, what it
    runs)."""
    seconds = {}
    for process in tree(root_pid):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            seconds[(process.pid, role(process.cmdline()))] = times.user + times.system
    return seconds


def role(argv: list[str]) -> str:
    """The program, or for Python the module or script it runs."""
    program = Path(argv[0]).name if argv else "?"
    if not program.startswith("python"):
        return program
    rest = [a for a in argv[1:4] if not a.startswith("-")]
    return Path(rest[0]).name if rest else program


class Numaserve:
    name = "numaserve"
    settings = ""  # added to configs/default.yaml's server: section

    def __init__(self, directory: Path) -> None:
        config = (ROOT / "configs/default.yaml").read_text()
        config = config.replace("tcp://127.0.0.1:5555", ENDPOINT)
        config = config.replace("cache_entries: 100000", "cache_entries: 0" + self.settings)
        self.server = Server(directory, config, name=f"peers-{time.monotonic_ns()}")
        self.server.wait_ready()
        self.pid = self.server.proc.pid
        self.target = numaserve_target([self.server.endpoint])

    def embed(self, text: str) -> list[float]:
        with Client(self.server.endpoint) as c:
            return c.embed(text).vector.tolist()

    def stop(self) -> None:
        self.server.stop()


class NumaserveUnbatched(Numaserve):
    """Micro-batching off (max_batch 1): what the default's batching under load buys."""

    name = "numaserve-batch-1"
    settings = "\n  max_batch: 1"


class NumaserveHttp(Numaserve):
    """The same server, driven as the peers are: HTTP, TEI's POST /embed, kept-alive."""

    name = "numaserve-http"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.target = http_target(f"{self.server.url}/embed")  # TEI's body: {"inputs": ...}


class HttpPeer:
    """A peer server started as a process tree (its own session), serving embeddings over
    HTTP: POST `body(text)` to `path`, the vector at `vector(answer)`."""

    name = ""
    path = "/embed"

    def __init__(self, directory: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.workers = len(os.sched_getaffinity(0))
        self.log = (directory / f"{self.name}-{port}.log").open("w")
        self.proc = subprocess.Popen(
            self.argv(port, directory),
            cwd=self.cwd(directory),
            env={**os.environ, **OFFLINE, **self.env()},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.target = http_target(self.url + self.path, body=self.body)
        deadline = time.monotonic() + 600
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start; see {self.log.name}")
            time.sleep(1)

    def argv(self, port: int, directory: Path) -> list[str]:
        raise NotImplementedError

    def cwd(self, directory: Path) -> Path:
        return ROOT

    def env(self) -> dict[str, str]:
        return {"OMP_NUM_THREADS": "1"}

    @staticmethod
    def body(text: str) -> dict:
        return {"text": text}

    @staticmethod
    def vector(answer: dict) -> list[float]:
        return answer["embedding"]

    def _answers(self) -> bool:
        try:  # every worker has loaded its model once a few requests in a row are answered
            for _ in range(4 * self.workers):
                self.embed("warm up")
            return True
        except (OSError, http.client.HTTPException):
            return False

    def embed(self, text: str) -> list[float]:
        request = urllib.request.Request(
            self.url + self.path,
            json.dumps(self.body(text)).encode(),
            {"Content-Type": "application/json"},
        )
        return self.vector(json.loads(urllib.request.urlopen(request, timeout=10).read()))

    def stop(self) -> None:
        """SIGTERM to the whole tree (TorchServe's launcher does not pass it on to its JVM)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # any process of the tree still there
        self.proc.wait()
        self.log.close()


class FastAPIPeer(HttpPeer):
    name = "fastapi"

    def argv(self, port: int, directory: Path) -> list[str]:
        return [
            str(Path(sys.executable).with_name("gunicorn")),
            f"--workers={self.workers}",
            "--worker-class=uvicorn.workers.UvicornWorker",
            f"--bind=127.0.0.1:{port}",
            "--timeout=120",
            "benchmarks.peer_apps.fastapi_app:app",
        ]


class RayPeer(HttpPeer):
    name = "ray"

    def argv(self, port: int, directory: Path) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peer_apps.ray_app", f"--port={port}"]


class InfinityPeer(HttpPeer):
    """infinity-emb's optimum (ONNX Runtime) engine with its dynamic batching, on numaserve's
    ONNX artifact: run from a directory holding the model's sentence-transformers files and
    the artifact as its one `model_quantized.onnx` (what the engine looks for). Its defaults
    otherwise: one process, ONNX Runtime's threads on every allowed core. Its warm-up (32 x
    512 tokens, 2.3 GB more RSS) is off, as the other servers have none of that size."""

    name = "infinity"
    path = "/embeddings"

    def argv(self, port: int, directory: Path) -> list[str]:
        return [
            str(PEERS / "infinity/bin/infinity_emb"),
            "v2",
            "--model-id=.",  # an absolute path is taken for a hub id
            "--engine=optimum",
            "--device=cpu",
            "--pooling-method=mean",  # else CLS pooling: not this model's embedding
            "--no-model-warmup",
            "--log-level=warning",  # no line a request, as numaserve
            "--host=127.0.0.1",
            f"--port={port}",
        ]

    def cwd(self, directory: Path) -> Path:
        model = directory / "infinity-model"
        if not model.exists():
            model.mkdir()
            source = model_dir()
            for entry in source.iterdir():
                if not entry.name.endswith(".onnx") and entry.name != "onnx":
                    (model / entry.name).symlink_to(entry)
            (model / "model_quantized.onnx").symlink_to(artifact())
        return model

    def env(self) -> dict[str, str]:
        return {}

    @staticmethod
    def body(text: str) -> dict:
        return {"input": [text]}

    @staticmethod
    def vector(answer: dict) -> list[float]:
        return answer["data"][0]["embedding"]


class TorchServePeer(HttpPeer):
    """TorchServe with its CPU launcher: one worker per core, each started by PyTorch's
    `run_cpu` under numactl on its own core, running numaserve's ONNX artifact with
    benchmarks/peer_apps/torchserve_handler.py. Loopback only, token auth and per-model
    dependency installs off, a queue deep enough for 128 clients, asynchronous logging."""

    name = "torchserve"
    path = "/predictions/minilm"

    def argv(self, port: int, directory: Path) -> list[str]:
        store = directory / f"torchserve-{port}"
        store.mkdir()
        subprocess.run(
            [
                str(PEERS / "torchserve/bin/torch-model-archiver"),
                "--model-name=minilm",
                "--version=1.0",
                f"--handler={ROOT / 'benchmarks/peer_apps/torchserve_handler.py'}",
                f"--extra-files={artifact()},{model_dir() / 'tokenizer.json'}",
                f"--export-path={store}",
            ],
            check=True,
        )
        properties = store / "config.properties"
        management, metrics = free_port(), free_port()
        properties.write_text(
            f"inference_address=http://127.0.0.1:{port}\n"
            f"management_address=http://127.0.0.1:{management}\n"
            f"metrics_address=http://127.0.0.1:{metrics}\n"
            f"default_workers_per_model={self.workers}\n"
            "cpu_launcher_enable=true\n"
            "job_queue_size=1000\n"
            "async_logging=true\n"  # its access log off the request's path
            "disable_token_authorization=true\n"
            "install_py_dep_per_model=false\n"
            "enable_envvars_config=false\n"
        )
        return [
            str(PEERS / "torchserve/bin/torchserve"),
            "--start",
            "--foreground",
            "--ncs",
            f"--model-store={store}",
            f"--ts-config={properties}",
            "--models=minilm=minilm.mar",
            "--disable-token-auth",
        ]

    def cwd(self, directory: Path) -> Path:
        return directory  # where it writes its logs/

    def env(self) -> dict[str, str]:
        # The launcher's check runs `python -m torch.backends.xeon.run_cpu` from PATH: without
        # the venv first, it fails and TorchServe drops the pinning without an error.
        return {"PATH": f"{PEERS / 'torchserve/bin'}:{os.environ['PATH']}"}


@functools.cache
def default_model() -> ModelConfig:
    """The model numaserve serves with configs/default.yaml: every server here serves it."""
    return load_config(ROOT / "configs/default.yaml").model


@functools.cache
def artifact() -> Path:
    """Its ONNX Runtime int8 artifact on this machine, as numaserve prepares it: the peers'
    model file (numaserve's own path is what `quantize: auto` chooses)."""
    int8 = dataclasses.replace(default_model(), backend="onnxruntime", quantize="int8")
    return artifact_for(int8, read_topology().isa)


def model_dir() -> Path:
    """Its checkpoint's directory: tokenizer and sentence-transformers files."""
    return Path(resolve_model_path(default_model().path))


def mixed_texts(short: list[str]) -> list[str]:
    """Texts of 1 to 16 consecutive sentences (about 10 to 250 tokens), evenly spread."""
    return [" ".join(short[i : i + 1 + (i * 7) % 16]) for i in range(len(short) - 16)]


def measure(system, texts: list[str], clients: int, total: int) -> dict:
    """The closed loop's figures, and the CPU time the server's processes spent a request
    answered: on cores it shares with the load generator, what the server would reach on
    cores of its own is (CPU time a request of the model alone) / (this)."""
    closed_loop(system.target, texts, clients, 5, seed=1)  # warm every instance
    before = cpu_seconds(system.pid)
    summary = closed_loop(system.target, texts, clients, max(20, total // clients), seed=2)
    after = cpu_seconds(system.pid)
    result = summary.summary()
    answered = max(1, len(summary.latencies))
    used = {key: seconds - before.get(key, 0.0) for key, seconds in after.items()}
    result["cpu_ms_per_request"] = 1000 * sum(used.values()) / answered
    result["cpu_ms_per_request_by_process"] = {
        f"{name} {pid}": round(1000 * seconds / answered, 4)
        for (pid, name), seconds in used.items()
    }
    result["latencies_ms"] = sorted(round(x * 1000, 3) for x in summary.latencies)
    return result


def ceiling(texts: list[str], seconds: float, isa: tuple[str, ...], tmp: Path) -> dict:
    """The model alone: numaserve's model object in one process per allowed CPU, batch 1 on
    the same texts' token ids, no server (benchmarks/instance_scaling.py's measure)."""
    model = default_model().path
    ids = [e.ids for e in Tokenizer(model, 256).raw.encode_batch(texts[:500])]
    ids_file = tmp / "ids.json"
    ids_file.write_text(json.dumps(ids))
    settings = argparse.Namespace(model=model, seconds=seconds)
    cpus = sorted(os.sched_getaffinity(0))
    alone = raw(settings, cpus, ids_file, isa)
    # each process runs the model flat out on its CPU: a run costs this much CPU time
    alone["cpu_ms_per_run"] = 1000 * len(cpus) / alone["runs_per_s"]
    return alone | {"tokens": sum(map(len, ids)) / len(ids)}


SYSTEMS = {
    kind.name: kind
    for kind in (
        Numaserve,
        NumaserveUnbatched,
        NumaserveHttp,
        InfinityPeer,
        TorchServePeer,
        FastAPIPeer,
        RayPeer,
    )
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="1,8,32,128", help="closed-loop clients, each level")
    parser.add_argument("--requests", type=int, default=2000, help="per level, all clients")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="of " + ",".join(SYSTEMS))
    parser.add_argument("--traffic", default="short,mixed", help="short, mixed or both")
    parser.add_argument("--seconds", type=float, default=10.0, help="the ceiling's window")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo), flush=True)
    levels = [int(c) for c in args.clients.split(",")]
    systems = [SYSTEMS[name] for name in args.systems.split(",")]
    short = stdlib_sentences()
    traffic = {"short": short, "mixed": mixed_texts(short)}
    traffic = {name: traffic[name] for name in args.traffic.split(",")}
    results = {"topology": topo.to_json(), "settings": vars(args) | {"json": str(args.json)}}
    rounds = results["rounds"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            row = {
                "ceiling": {
                    t: ceiling(texts, args.seconds, topo.isa, Path(tmp))
                    for t, texts in traffic.items()
                }
            }
            for kind in systems:
                system = kind(Path(tmp))
                try:
                    if r == 0:
                        row[f"{system.name}_vectors"] = [system.embed(t) for t in short[:20]]
                    row[system.name] = {
                        t: {str(c): measure(system, texts, c, args.requests) for c in levels}
                        for t, texts in traffic.items()
                    }
                    row[system.name]["memory"] = memory(system.pid)
                finally:
                    system.stop()
                print(f"round {r + 1}: {system.name} measured", flush=True)
            rounds.append(row)
    reference = Embedder(quantize=False)
    fp32 = [reference.embed(t) for t in short[:20]]
    results["agreement"] = {
        kind.name: [
            cosine(a, b) for a, b in zip(rounds[0].pop(f"{kind.name}_vectors"), fp32, strict=True)
        ]
        for kind in systems
    }
    report(results, levels, list(traffic), [kind.name for kind in systems])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def report(results: dict, levels: list[int], traffic: list[str], names: list[str]) -> None:
    w = max(map(len, names)) + 1
    print(
        f"\n{results['settings']['requests']} requests a level; same work: cosine of each "
        "server's embeddings to the fp32 model's, 20 sentences"
    )
    for name, cosines in results["agreement"].items():
        print(f"  {name:<{w}} mean {sum(cosines) / len(cosines):.4f}  lowest {min(cosines):.4f}")
    print(
        "\nof ceiling: req/s over the model alone's runs/s on the same CPUs (the load generator"
        " shares them);\nCPU share: the model alone's CPU time a run over the server's a request"
        " (what it would reach on cores of its own)"
    )
    for i, row in enumerate(results["rounds"], 1):
        for t in traffic:
            limit = row["ceiling"][t]
            print(
                f"\nround {i}, {t} texts ({limit['tokens']:.0f} tokens on average); the model "
                f"alone, one process a CPU: {limit['runs_per_s']:.1f} runs/s, "
                f"{limit['cpu_ms_per_run']:.2f} CPU ms a run"
            )
            print(
                f"{'clients':>7}  {'server':<{w}}{'req/s':>8}{'of ceiling':>11}{'CPU ms':>8}"
                f"{'CPU share':>10}{'p50 ms':>9}{'p99 ms':>9}  numaserve: throughput x, p99 x"
            )
            for c in levels:
                ours = row[names[0]][t][str(c)]
                for name in names:
                    s = row[name][t][str(c)]
                    ratio = (
                        f"{ours['throughput_rps'] / s['throughput_rps']:.2f}x, "
                        f"{ours['latency_ms']['p99'] / s['latency_ms']['p99']:.2f}x"
                        if name != names[0] and s["throughput_rps"]
                        else ""
                    )
                    errors = f" ({sum(s['errors'].values())} errors)" if s["errors"] else ""
                    print(
                        f"{c:>7}  {name:<{w}}{s['throughput_rps']:>8.1f}"
                        f"{s['throughput_rps'] / limit['runs_per_s']:>11.2f}"
                        f"{s['cpu_ms_per_request']:>8.2f}"
                        f"{limit['cpu_ms_per_run'] / s['cpu_ms_per_request']:>10.2f}"
                        f"{s['latency_ms']['p50'] or 0:>9.2f}{s['latency_ms']['p99'] or 0:>9.2f}"
                        f"  {ratio}{errors}"
                    )
    print("\nmemory, MB (the whole process tree; PSS counts shared pages once):")
    for name in names:
        m = results["rounds"][-1][name]["memory"]
        print(
            f"  {name:<{w}} PSS {m['total_pss_mb']:>6.0f}  RSS {m['total_rss_mb']:>6.0f}"
            f"  per process RSS {m['rss_mb']}"
        )


if __name__ == "__main__":
    main()
