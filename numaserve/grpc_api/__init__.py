"""TEI's gRPC API (`tei.v1`, server.grpc; docs/grpc.md), an adapter on the front's core
(front/core.py), served by every front process beside the HTTP API. Its modules:

- `tei.proto`: TEI's own proto, unchanged (Apache-2.0, its header names it);
- `proto.py`: its messages and services, read from it once, at a front's start;
- `calls.py`: one call's life (its metadata read, its key checked, its span, its errors as
  TEI's status codes, its timings, counts and slow log line) and a stream's, in order;
- `services.py`: each of TEI's services (Info, Embed, Predict, Rerank, Tokenize), translating
  between its messages and the core's calls;
- `server.py`: grpcio's asyncio server on the front's loop, with the standard health service
  and server reflection.
"""
