"""Every HTTP route, by the API it copies: TEI's (`tei.py`), OpenAI's (`openai.py`), the
Cohere/Jina rerank (`cohere.py`), our own (`own.py`), and the API page (`docs.py`, /docs);
what they share with the gRPC API is the front's (front/inputs.py)."""

from numaserve.http.routes import cohere, docs, openai, own, tei

ROUTES = (*tei.ROUTES, *openai.ROUTES, *cohere.ROUTES, *own.ROUTES, *docs.ROUTES)
