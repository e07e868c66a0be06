"""Status reports built by hand (status/report.py's records), for tests of what reads them:
the merge, the formatter, the exposition, the supervisor's fake shards. Every field a test
does not name has a plain default."""

from __future__ import annotations

from numaserve.status.report import Cache, Instance, Pool, Report

NO_CACHE = Cache(entries=0, capacity=10, hits=0, misses=0, hit_rate=0.0)


def pool(name: str = "main", model_name: str = "default", **fields) -> Pool:
    return Pool(
        **{"name": name, "model_name": model_name, "max_tokens": 64, "queue": 0, "ready": 1}
        | fields
    )


def instance(name: str, **fields) -> Instance:
    return Instance(
        **{"name": name, "pool": "main", "state": "ready", "pid": None, "cpus": [], "nodes": []}
        | fields
    )


def report(shard: int = 0, instances: tuple[Instance, ...] = (), **fields) -> Report:
    model = fields.get("model_name", "default")
    return Report(
        **{
            "task": "embed",
            "model_name": model,
            "shard": shard,
            "cpus": [shard],
            "model": "bundled:minilm",
            "instances": tuple(instances),
            "pools": (pool(model_name=model),),
            "cache": NO_CACHE,
            "requests": {},
            "errors": {},
            "draining": False,
            "routed_pids": tuple(i.pid for i in instances if i.routed),
        }
        | fields
    )
