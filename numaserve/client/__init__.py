"""Client library: `Client` (blocking) and `AsyncClient` (asyncio) for a numaserve server.

Each request goes out on a DEALER socket and waits up to `timeout` for the reply with its id.
On a timeout the socket is closed and a fresh one, to another endpoint where there is one,
sends the request again (the zguide's Lazy Pirate), up to `retries` times: requests are
idempotent. `overloaded` and `no_instance` replies also move on to another endpoint.

Given several endpoints, or a host name that resolves to several addresses (a Kubernetes
headless Service), a client spreads its requests over all of them, the fewest outstanding
first; one that stops answering is set aside until it answers a ping again. How, for clients
in other languages: docs/protocol.md#many-servers.

    with Client(["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"], timeout=1.0) as client:
        vectors = [e.vector for e in client.embed(["first text", "second text"])]

A classify model that reads pairs (NLI) takes each pair as a tuple: `classify(("premise",
"hypothesis"))` is one Classification, `classify([("a", "b"), ("c", "d")])` a list. A
cross-encoder scores documents for a query: `rerank("query", ["doc 1", "doc 2"], top_k=1)`. A
token classifier finds entities: `ner("Ada Lovelace lived in London")`. A SPLADE model gives
sparse embeddings: `sparse("a text")` is a SparseEmbedding, its vocabulary indices and weights.
An embedding model's token vectors, unpooled: `embed_tokens("a text").vectors`. A
late-interaction (ColBERT) model's vectors, one per token that counts, as a query or as a
document: `embed_multi("a question", prompt_name="query").vectors`.

A server with `server.curve` admits only clients holding an authorised key pair:

    keys = ClientKeys.load(server_key="server.key", client_key="billing.key_secret")
    client = Client("tcp://10.0.0.1:5555", curve=keys)

A client for one model of a server that names its models asks for it by name:
`Client("tcp://10.0.0.1:5555", model="toxicity")` (without: the server's only model).

When no answer can come, a call says why rather than waiting out every retry: `Unreachable`
where nothing accepts the connection within `connect_timeout` (2 s), `HandshakeFailed` where
the ZeroMQ or CurveZMQ handshake fails (keys missing, not let in, or wrong) or the connection
is closed before it ends (also what a proxy with no server behind it does), `TooLarge` for a
request over the server's `server.max_message_bytes` (checked before it is sent), and
`Timeout` (which the first two are too) where the server took the connection but did not
answer in time. A bad argument is a TypeError or ValueError that names it.

A Client is not thread-safe: use one per thread. An AsyncClient serves many coroutines at once.

Its modules: `blocking.py` (`Client`) and `aio.py` (`AsyncClient`); `calls.py`, what both
share; `arguments.py`, a call's arguments checked before sending; `endpoints.py`, which server
each request goes to; `linkwatch.py` and `probes.py`, whether a server accepts and answers
again; `errors.py`, the errors a call raises; `trace_context.py`, the caller's trace sent on.
"""

from numaserve.client.aio import AsyncClient
from numaserve.client.blocking import Client
from numaserve.client.errors import (
    BadRequest,
    DeadlineExceeded,
    HandshakeFailed,
    InternalError,
    NoInstance,
    NumaserveError,
    Overloaded,
    Timeout,
    TooLarge,
    TooLong,
    Unreachable,
)

# The results each task returns, importable from here: `from numaserve.client import Embedding`.
from numaserve.tasks.classify import Classification
from numaserve.tasks.embed import ChunkEmbeddings, Embedding, TokenEmbedding
from numaserve.tasks.multivector import MultiVectors
from numaserve.tasks.ner import Entities, Entity
from numaserve.tasks.rerank import Ranked
from numaserve.tasks.sparse import SparseEmbedding
from numaserve.wire.curve import ClientKeys

__all__ = [
    "AsyncClient",
    "BadRequest",
    "ChunkEmbeddings",
    "Classification",
    "Client",
    "ClientKeys",
    "DeadlineExceeded",
    "Embedding",
    "Entities",
    "Entity",
    "HandshakeFailed",
    "InternalError",
    "MultiVectors",
    "NoInstance",
    "NumaserveError",
    "Overloaded",
    "Ranked",
    "SparseEmbedding",
    "Timeout",
    "TokenEmbedding",
    "TooLarge",
    "TooLong",
    "Unreachable",
]
