"""Run numaserve for real from tests and benchmarks, ours and yours, on this machine:

- `server.py`'s `Server`: `numaserve start` on a config, as an operator runs it, on a free port, until
  it serves; its status, reloads and stop;
- `cluster.py`'s `Cluster`: a router shard and its workers from a config, without a supervisor;
- `load.py`'s `RawLoad`: open- and closed-loop load over raw ZeroMQ, every outcome counted;
- `ports.py`'s `free_port`: a port for a server to listen on that no outgoing connection can
  take before it does;
- `otlp.py`: real OTLP trace receivers (HTTP and gRPC), decoding what a server exports;
- `windows.py`: a long document's windows cut by hand, as a reranker's reference scores them.

Nothing here is used by a running server; it imports no model runtime.
"""
