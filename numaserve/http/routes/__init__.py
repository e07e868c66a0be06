"""Every HTTP route, by the API it copies: TEI's, OpenAI's, the Cohere/Jina rerank, our own."""

from numaserve.http.routes import cohere, openai, own, tei

ROUTES = (*tei.ROUTES, *openai.ROUTES, *cohere.ROUTES, *own.ROUTES)
