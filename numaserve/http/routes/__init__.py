"""Every HTTP route, by the API it copies: TEI's, OpenAI's, the Cohere/Jina rerank, our own,
and the API page (/docs)."""

from numaserve.http.routes import cohere, docs, openai, own, tei

ROUTES = (*tei.ROUTES, *openai.ROUTES, *cohere.ROUTES, *own.ROUTES, *docs.ROUTES)
