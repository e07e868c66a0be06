"""The HTTP front: TEI's routes, OpenAI's /v1/embeddings, a Cohere/Jina-style /v1/rerank and
numaserve's own, served by processes of their own that hand each request to the router
shards as a protocol request (docs/http.md)."""
