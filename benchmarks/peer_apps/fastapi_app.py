"""Peer 1: the published "serve BERT with FastAPI on CPU" setup, gunicorn with uvicorn
workers, one model per worker (workers = cores).

Run:  OMP_NUM_THREADS=1 gunicorn -w 2 -k uvicorn.workers.UvicornWorker \
          --bind 127.0.0.1:8000 benchmarks.peer_apps.fastapi_app:app
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from benchmarks.peer_apps.minilm import Embedder

embedder = Embedder()
app = FastAPI()


class Request(BaseModel):
    text: str


@app.post("/embed")
def embed(request: Request) -> dict:
    return {"embedding": embedder.embed(request.text)}


@app.get("/health")
def health() -> dict:
    return {"ok": True}
