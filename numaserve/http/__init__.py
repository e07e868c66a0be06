"""The HTTP front: TEI's routes, OpenAI's /v1/embeddings, a Cohere/Jina-style /v1/rerank and
numaserve's own, served by processes of their own that hand each request to the router
shards as a protocol request (docs/http.md). Its modules:

- `front.py`: the process (its socket, shared by SO_REUSEPORT; its uvloop loop; its stop);
- `connection.py`: one client's HTTP/1.1 connection, over httptools;
- `app.py`: which route answers, the key check, the model named, and the one way every route
  runs a task; `routing.py`: what every route is made of; `routes/`: each API's routes;
- `upstream.py`: the way to the shards, a DEALER per model;
- `api_errors.py`: each API's shape of an error; `keys.py`: the API keys file;
- `openapi.py`: /openapi.json; `stats.py`: its counts for /metrics; `traced.py`: its spans;
- `__main__.py`: `python -m numaserve.http --spec JSON`, as the supervisor starts it.
"""
