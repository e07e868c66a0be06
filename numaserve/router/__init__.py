"""A router shard: between the clients and the worker pools, it tokenizes, caches, queues and
dispatches by length (docs/architecture.md, "router/"). Its modules:

- `loop.py`: the shard's one loop: client messages, worker messages, heartbeats, status;
- `book.py`: every request a shard answers, from receipt to reply (no sockets);
- `in_flight.py`: the requests not answered yet, and their deadlines;
- `dispatch.py`: which worker runs which text, by length, to sized pools (pure);
- `cache.py`: the result cache, keyed by model, task and token ids;
- `handover.py`: a request passed to a peer shard that has an instance for it;
- `status.py`: the shard's report of itself (`ShardReport`), and its status questions to the
  supervisor;
- `metrics.py`: what a shard counts for /metrics; `traces.py`: its spans, where tracing is on;
- `connections.py`: what libzmq's socket monitor says of client connections;
- `frontend.py`: the ZeroMQ frontend, one client endpoint in front of several shards;
- `process.py`: what a router-side process shares once begun (its context, its send);
- `__main__.py`: `python -m numaserve.router --spec JSON`, as the supervisor starts it.
"""
