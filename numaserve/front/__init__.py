"""The front's core, which knows no transport: what the HTTP API (http/) and TEI's gRPC API
(grpc_api/) share, each an adapter on it, in the front processes (fronts.py). Its modules:

- `core.py`: the `Core` (the model a call names, the count check, priority, the protocol
  request to the model's shards and what they said of it) and the `Exchange` every
  transport reads its calls into; TEI's timing fields and the slow-call log line;
- `upstream.py`: the way to the shards, a DEALER per model;
- `inputs.py`: inputs read into texts, embeddings cut and normalised, tokens as TEI lists them;
- `facts.py`: what a front says of a model (TEI's Info, a classifier's labels);
- `errors.py`: `ApiError` and what each protocol error code becomes;
- `keys.py`: the API keys file; `stats.py`: the counts for /metrics.
"""
