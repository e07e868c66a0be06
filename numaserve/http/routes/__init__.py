"""Every HTTP route, by the API it copies: TEI's (`tei.py`), OpenAI's (`openai.py`), the
Cohere/Jina rerank (`cohere.py`), our own (`own.py`), and the API page (`docs.py`, /docs);
`inputs.py` what they share: inputs read into texts, embeddings cut and normalised."""

from numaserve.http.routes import cohere, docs, openai, own, tei

ROUTES = (*tei.ROUTES, *openai.ROUTES, *cohere.ROUTES, *own.ROUTES, *docs.ROUTES)
