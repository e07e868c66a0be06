"""The HTTP API: TEI's routes, OpenAI's /v1/embeddings, a Cohere/Jina-style /v1/rerank and
numaserve's own (docs/http.md), an adapter on the front's core (front/), served by the front
processes (fronts.py). Its modules:

- `server.py`: its socket on server.http (shared by SO_REUSEPORT) and its connections;
- `connection.py`: one client's HTTP/1.1 connection, over httptools;
- `app.py`: which route answers, the headers read into the core's call, the model named;
  `routing.py`: what every route is made of; `routes/`: each API's routes;
- `api_errors.py`: each API's shape of an error;
- `openapi.py`: /openapi.json; `traced.py`: its spans.
"""
