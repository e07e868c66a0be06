"""Peer 2: Ray Serve, one replica per core, each with one CPU and one torch thread.

Run:  python -m benchmarks.peer_apps.ray_app --port 8000 [--replicas 2]
Serves POST /embed until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading

import ray
from ray import serve
from starlette.requests import Request


@serve.deployment(ray_actor_options={"num_cpus": 1})
class EmbedDeployment:
    def __init__(self) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"
        from benchmarks.peer_apps.minilm import Embedder

        self.embedder = Embedder()

    async def __call__(self, request: Request) -> dict:
        return {"embedding": self.embedder.embed((await request.json())["text"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--replicas", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    ray.init(num_cpus=args.replicas, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(
        EmbedDeployment.options(num_replicas=args.replicas).bind(),
        route_prefix="/embed",
        blocking=False,
    )
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
