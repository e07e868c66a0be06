"""`numaserve bench`: a load generator for any running numaserve server.

Closed loop: N clients, each sending M requests back to back (the published method was 32 x
1000). Open loop: requests at a fixed rate, whatever the answers do; latency counts from the
moment a request was due, so a server that falls behind cannot hide it (coordinated omission).
Texts come from a corpus file, one per line, drawn at random so that its length distribution
is kept. The closed loop can also drive an HTTP server (`--http URL`), so that numaserve and a
peer are measured by the same generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from numaserve.client import AsyncClient, Client, ClientKeys, NumaserveError


class CorpusError(ValueError):
    pass


def load_corpus(path: str | Path | None) -> list[str]:
    """Non-blank lines of `path`; without a path, the stdlib docstring sentences."""
    if path is None:
        from numaserve.corpus import stdlib_sentences

        return stdlib_sentences()
    try:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(f"cannot read corpus {path}: {e}") from None
    texts = [line for line in lines if line]
    if not texts:
        raise CorpusError(f"corpus {path} has no non-blank line")
    return texts


@dataclass
class Result:
    mode: str
    op: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # of successful requests, in seconds
    errors: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # each error code's first message
    cache: dict[str, int] | None = None  # the router cache's hits and misses during the run
    answered_by: list[str] = field(default_factory=list)  # each server: where, what it serves
    texts: str = ""  # where the texts came from
    servers: Counter[str] = field(default_factory=Counter)  # replies by server address

    def record_error(self, code: str, message: str = "") -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        if message:
            self.reasons.setdefault(code, message)

    def summary(self) -> dict:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1000, 3) if lat else None

        return {
            "mode": self.mode,
            "op": self.op,
            "requests": len(lat) + sum(self.errors.values()),
            "ok": len(lat),
            "errors": dict(self.errors),
            "error_messages": dict(self.reasons),
            "cache": self.cache,
            "answered_by": self.answered_by,
            "texts": self.texts,
            "servers": dict(sorted(self.servers.items())),
            "seconds": round(self.seconds, 3),
            "throughput_rps": round(len(lat) / self.seconds, 1) if self.seconds else 0.0,
            "latency_ms": {
                "p50": round(statistics.median(lat) * 1000, 3) if lat else None,
                "p95": pct(95),
                "p99": pct(99),
                "max": round(lat[-1] * 1000, 3) if lat else None,
                "mean": round(statistics.fmean(lat) * 1000, 3) if lat else None,
            },
        }


def format_result(summary: dict) -> str:
    lat = summary["latency_ms"]

    def ms(v):
        return "-" if v is None else f"{v:.2f}"

    errors = ", ".join(f"{k}: {v}" for k, v in sorted(summary["errors"].items())) or "none"
    lines = [f"server      {where}" for where in summary["answered_by"]]
    lines += [f"texts       {summary['texts']}"] if summary["texts"] else []
    lines += [
        f"{summary['mode']} loop, {summary['op']}: {summary['requests']} requests in {summary['seconds']:.1f} s",
        f"throughput  {summary['throughput_rps']:.1f} requests/s",
        f"latency ms  p50 {ms(lat['p50'])}  p95 {ms(lat['p95'])}  p99 {ms(lat['p99'])}  max {ms(lat['max'])}",
        f"errors      {errors}",
    ]
    lines += [f"  {code}: {message}" for code, message in sorted(summary["error_messages"].items())]
    if len(servers := summary["servers"]) > 1:
        replies = sum(servers.values())
        lines.append("servers     replies by server (the client spreads over every one):")
        lines += [f"  {where}: {n} ({100 * n / replies:.1f}%)" for where, n in servers.items()]
    cache = summary["cache"]
    if cache is None:
        lines.append("cache       not seen from here: `numaserve status` on the server shows it")
    elif not cache["hits"]:
        lines.append("cache       no text was answered from the router's cache")
    else:
        texts = cache["hits"] + cache["misses"]
        lines.append(
            f"cache       {cache['hits']} of {texts} texts were answered from the router's cache, "
            "not the model (server.cache_entries: 0, or a corpus of more distinct texts, "
            "measures the model)"
        )
    return "\n".join(lines)


class Failed(Exception):
    """A request that got no result; `code` says why (a numaserve error code, `http_503`...),
    and `message` what the server said, where it said something."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(code)
        self.code, self.message = code, message


Send = Callable[..., object]  # sends one request (Draw's arguments) and waits, or raises Failed
Connect = Callable[[], AbstractContextManager[Send]]  # one connection per simulated client
Draw = Callable[[random.Random, list[str]], tuple]  # one request's arguments, from the corpus


def one_text(rng: random.Random, texts: list[str]) -> tuple:
    return (rng.choice(texts),)


def with_words_shuffled(draw: Draw, shuffler: random.Random | None = None) -> Draw:
    """`draw`, each text with its words in a random order: the built-in corpus has a few
    thousand sentences, so a long run, or a second one, would be answered by the router's
    cache rather than the model. Shuffled afresh each run (`shuffler`, seeded by the system,
    not by --seed, which picks the texts), they seldom repeat, and each keeps its words, and
    so about its length in tokens."""
    shuffler = shuffler or random.Random()
    lock = threading.Lock()  # the clients' threads share it

    def shuffled(text: str) -> str:
        words = text.split()
        with lock:
            shuffler.shuffle(words)
        return " ".join(words)

    def each(arg):
        if isinstance(arg, str):
            return shuffled(arg)
        return type(arg)(shuffled(text) for text in arg)  # a pair, or documents

    return lambda rng, texts: tuple(each(arg) for arg in draw(rng, texts))


def drawing(op: str, pairs: bool = False, documents: int = 10) -> Draw:
    """What each request sends: a text; with `pairs`, a pair of texts (classify); for
    rerank, a query and `documents` other texts of the corpus."""
    if op == "rerank":
        return lambda rng, texts: (rng.choice(texts), [rng.choice(texts) for _ in range(documents)])
    if pairs:
        return lambda rng, texts: ((rng.choice(texts), rng.choice(texts)),)
    return one_text


def numaserve_target(
    endpoints: list[str],
    op: str = "embed",
    timeout: float = 10.0,
    curve: ClientKeys | None = None,
    model: str | None = None,
    retries: int = 0,
    servers: Counter[str] | None = None,
) -> Connect:
    """Clients of the servers at `endpoints`, asking `model` (None: the server's only one),
    each trying `retries` more times; each client's replies by server are added to
    `servers`."""

    @contextlib.contextmanager
    def connect() -> Iterator[Send]:
        with Client(endpoints, timeout=timeout, retries=retries, curve=curve, model=model) as c:
            call = getattr(c, op)

            def send(*request) -> object:
                try:
                    return call(*request)
                except NumaserveError as e:
                    raise Failed(e.code, e.message) from None

            try:
                yield send
            finally:
                if servers is not None:
                    servers.update(c.served)

    return connect


def text_body(text: str) -> dict:
    return {"text": text}


# numaserve's own routes (docs/http.md), by path: the body each API takes for one text. Any
# other path gets `{"text": ...}`, as the peers' apps in benchmarks/ take.
TEI_TEXT_ROUTES = ("/embed", "/embed_sparse", "/embed_all", "/predict", "/ner", "/", "/invocations")


def body_for(path: str, model: str | None = None) -> Callable[[str], object]:
    """The JSON body for one text on `path`: TEI's `inputs`, OpenAI's `input`, or `text`."""
    named = {"model": model} if model else {}
    if path in TEI_TEXT_ROUTES:
        return lambda text: {"inputs": text, **named}
    if path == "/v1/embeddings":
        return lambda text: {"input": text, "model": model or "default"}
    return text_body


def http_target(
    url: str,
    timeout: float = 10.0,
    body: Callable[[str], object] | None = None,
    api_key: str | None = None,
    model: str | None = None,
) -> Connect:
    """POST `body(text)` as JSON to `url` on a kept-alive connection; 200 is success. Without
    `body`, the body of the route the URL names (body_for)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// URL: {url!r}")
    path = parts.path or "/"
    body = body or body_for(path, model)
    if parts.query:
        path = f"{path}?{parts.query}"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    @contextlib.contextmanager
    def connect() -> Iterator[Send]:
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)

        def send(text: str) -> object:
            payload = json.dumps(body(text)).encode()
            try:
                conn.request("POST", path, payload, headers)
                response = conn.getresponse()
                data = response.read()
            except TimeoutError:
                conn.close()  # the next request opens a fresh connection
                raise Failed("timeout") from None
            except (OSError, http.client.HTTPException):
                conn.close()
                raise Failed("connection") from None
            if response.status != 200:
                raise Failed(f"http_{response.status}", _error_message(data))
            return data

        try:
            yield send
        finally:
            conn.close()

    return connect


def _error_message(data: bytes) -> str:
    """What an HTTP error response says: its JSON `error` (TEI, OpenAI), or its first bytes."""
    try:
        error = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return data[:200].decode("utf-8", "replace")
    if isinstance(error, dict):  # OpenAI's {"error": {"message": ...}}
        error = error.get("message")
    return str(error)[:200] if error else data[:200].decode("utf-8", "replace")


def closed_loop(
    connect: Connect,
    texts: list[str],
    clients: int,
    requests: int,
    op: str = "embed",
    progress: Callable[[int], None] | None = None,
    seed: int = 0,
    draw: Draw = one_text,
) -> Result:
    """`clients` threads, each with its own connection, sending `requests` requests in turn."""
    result = Result("closed", op)
    lock = threading.Lock()
    start_gate = threading.Barrier(clients + 1)

    def run(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        with connect() as send:
            start_gate.wait()
            for _ in range(requests):
                request = draw(rng, texts)
                began = time.perf_counter()
                try:
                    send(*request)
                    elapsed, error = time.perf_counter() - began, None
                except Failed as e:
                    error = e
                with lock:  # the progress bar is not thread-safe either
                    if error is None:
                        result.latencies.append(elapsed)
                    else:
                        result.record_error(error.code, error.message)
                    if progress:
                        progress(1)

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    start_gate.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - began
    return result


def open_loop(
    endpoints: list[str],
    texts: list[str],
    rate: float,
    duration: float,
    op: str = "embed",
    timeout: float = 10.0,
    progress: Callable[[int], None] | None = None,
    seed: int = 0,
    draw: Draw = one_text,
    curve: ClientKeys | None = None,
    model: str | None = None,
    retries: int = 0,
) -> Result:
    """`rate` requests a second for `duration` seconds, each sent when due, to `model`, each
    tried `retries` more times where it gets no reply."""
    result = Result("open", op)
    rng = random.Random(seed)

    async def one(client: AsyncClient, request: tuple, due: float) -> None:
        try:
            await getattr(client, op)(*request)
            result.latencies.append(time.perf_counter() - due)
        except NumaserveError as e:
            result.record_error(e.code, e.message)
        if progress:
            progress(1)

    async def run() -> None:
        async with AsyncClient(
            endpoints, timeout=timeout, retries=retries, curve=curve, model=model
        ) as client:
            began = time.perf_counter()
            tasks = []
            for i in range(int(rate * duration)):
                due = began + i / rate
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks.append(asyncio.create_task(one(client, draw(rng, texts), due)))
            await asyncio.gather(*tasks)
            result.seconds = time.perf_counter() - began
            result.servers.update(client.served)

    asyncio.run(run())
    return result
