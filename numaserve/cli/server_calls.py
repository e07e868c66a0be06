"""The commands that ask a running server: embed, classify, ner, rerank, bench."""

from __future__ import annotations

import sys
from collections import Counter

import click

from numaserve.cli.common import (
    MachineError,
    UserError,
    asked_model,
    call_server,
    client_keys,
    endpoint_option,
    file_option,
    json_option,
    main,
    model_option,
    print_json,
    print_results,
    read_texts,
    timeout_option,
)
from numaserve.status.report import BadReport, ServerReport
from numaserve.tasks import NAMES, TASKS
from numaserve.tasks.base import MAX_WINDOWS
from numaserve.tasks.ner import AGGREGATIONS, DEFAULT_AGGREGATION


def _result_json(result) -> dict:
    from numaserve.client import (
        Embedding,
        Entities,
        MultiVectors,
        Ranked,
        SparseEmbedding,
        TokenEmbedding,
    )

    if isinstance(result, Entities):
        fields = {
            "entities": [
                {k: v for k, v in vars(e).items() if v is not None} for e in result.entities
            ]
        }
    elif isinstance(result, Embedding):
        fields = {"embedding": [round(float(x), 7) for x in result.vector]}
    elif isinstance(result, (TokenEmbedding, MultiVectors)):
        key = "token_vectors" if isinstance(result, TokenEmbedding) else "vectors"
        fields = {key: [[round(float(x), 7) for x in row] for row in result.vectors]}
    elif isinstance(result, SparseEmbedding):
        fields = {
            "indices": result.indices.tolist(),
            "values": [round(float(x), 7) for x in result.values],
        }
    elif isinstance(result, Ranked):
        fields = {"index": result.index, "score": result.score}
        fields |= {"logit": result.logit} if result.logit is not None else {}
        fields |= {"chunks": result.chunks} if result.chunks > 1 else {}
    else:
        fields = {"label": result.label, "probs": list(result.probs)}
        fields |= {"logits": list(result.logits)} if result.logits is not None else {}
    return {**fields, "tokens": result.tokens, "truncated": result.truncated}


raw_scores_option = click.option(
    "--raw-scores", is_flag=True, help="Print the model's logits too, before its activation."
)


def sends_texts(command):
    """The arguments and options of a command that sends TEXTS to a running server."""
    for option in (json_option, timeout_option, endpoint_option, model_option, file_option):
        command = option(command)
    return click.argument("texts", nargs=-1)(command)


@main.command()
@sends_texts
@click.option(
    "--prompt-name",
    help="One of the model's own prompts, put before each text (default: the model's default).",
)
@click.option(
    "--token-vectors",
    is_flag=True,
    help="Each token's vector, unpooled (TEI's /embed_all), not the text's one vector.",
)
def embed(
    texts, file, endpoints, timeout: float, as_json: bool, prompt_name, token_vectors: bool
) -> None:
    """Print the embeddings of TEXTS as JSON, a line per text ('-': one text from standard
    input)."""
    batch = read_texts(texts, file)
    method = "embed_tokens" if token_vectors else "embed"
    results = call_server(endpoints, timeout, method, batch, prompt_name=prompt_name)
    print_results([_result_json(r) for r in results])


@main.command("embed-multi")
@sends_texts
@click.option(
    "--prompt-name",
    type=click.Choice(["query", "document"]),
    default="document",
    show_default=True,
    help="Read TEXTS as queries or as documents.",
)
@click.option(
    "--pool-factor",
    type=click.FloatRange(1, 32),
    help="Pool a document's vectors into about this many times fewer (hierarchical pooling).",
)
def embed_multi(
    texts, file, endpoints, timeout: float, as_json: bool, prompt_name, pool_factor
) -> None:
    """Print a late-interaction (ColBERT) model's vectors of TEXTS as JSON, a line per text:
    one per token that counts (a server with model.task: multivector; '-': one text from
    standard input)."""
    batch = read_texts(texts, file)
    results = call_server(
        endpoints, timeout, "embed_multi", batch, prompt_name=prompt_name, pool_factor=pool_factor
    )
    print_results([_result_json(r) for r in results])


@main.command()
@sends_texts
def sparse(texts, file, endpoints, timeout: float, as_json: bool) -> None:
    """Print the sparse embeddings of TEXTS as JSON, a line per text: a SPLADE model's
    non-zero weights by vocabulary index (a server with model.task: sparse; '-': one text
    from standard input)."""
    results = call_server(endpoints, timeout, "sparse", read_texts(texts, file))
    print_results([_result_json(r) for r in results])


@main.command()
@click.argument("texts", nargs=-1)
@file_option
@click.option(
    "--pairs",
    is_flag=True,
    help="Read TEXTS two by two as pairs (premise, hypothesis), for a model that takes pairs.",
)
@raw_scores_option
@model_option
@endpoint_option
@timeout_option
@json_option
def classify(
    texts, file, pairs: bool, raw_scores: bool, endpoints, timeout: float, as_json: bool
) -> None:
    """Print the label and probabilities of each of TEXTS (or each pair) as JSON, a line per
    text ('-': one text from standard input)."""
    texts = read_texts(texts, file)
    if pairs and len(texts) % 2:
        raise click.UsageError(f"--pairs needs an even number of texts; got {len(texts)}")
    batch = list(zip(texts[::2], texts[1::2], strict=True)) if pairs else list(texts)
    results = call_server(endpoints, timeout, "classify", batch, raw_scores=raw_scores)
    labels = _label_names(endpoints, timeout)
    print_results([_named(_result_json(r), labels) for r in results])


def _label_names(endpoints, timeout: float) -> list[str] | None:
    """The classifier's label names, in its output's order, as its instances said them."""
    report = ServerReport.from_wire(call_server(endpoints, timeout, "status"))
    model = asked_model()
    for instance in report.instances:
        routing = instance.routing
        if routing and routing.labels and model in (None, instance.slot.model_name):
            return routing.labels
    return None


def _named(fields: dict, labels: list[str] | None) -> dict:
    """A classification's probabilities (and logits) by label name, where the names are
    known and one a value."""
    for key in ("probs", "logits"):
        if labels and key in fields and len(fields[key]) == len(labels):
            fields[key] = dict(zip(labels, fields[key], strict=True))
    return fields


@main.command()
@click.argument("texts", nargs=-1)
@file_option
@click.option(
    "--aggregation",
    type=click.Choice(AGGREGATIONS),
    default=DEFAULT_AGGREGATION,
    show_default=True,
    help="How tokens become entities, as transformers' token-classification pipeline does.",
)
@model_option
@endpoint_option
@timeout_option
@json_option
def ner(texts, file, aggregation: str, endpoints, timeout: float, as_json: bool) -> None:
    """Print the named entities of each of TEXTS as JSON, a line per text (a server with
    model.task: ner; '-': one text from standard input)."""
    results = call_server(endpoints, timeout, "ner", read_texts(texts, file), aggregation)
    print_results([_result_json(r) for r in results])


@main.command()
@click.argument("query")
@click.argument("documents", nargs=-1)
@file_option
@click.option("--top-k", type=click.IntRange(min=1), help="Only the best K, best first.")
@click.option(
    "--max-chunks-per-doc",
    type=click.IntRange(min=1, max=MAX_WINDOWS),
    help="Score a document longer than the model reads in at most N windows (1: cut it); "
    "default: the server's model.max_chunks_per_doc.",
)
@raw_scores_option
@model_option
@endpoint_option
@timeout_option
@json_option
def rerank(
    query,
    documents,
    file,
    top_k: int | None,
    max_chunks_per_doc: int | None,
    raw_scores: bool,
    endpoints,
    timeout: float,
    as_json: bool,
) -> None:
    """Print a cross-encoder's score of each of DOCUMENTS for QUERY as JSON, a line per
    document, in the documents' order (the HTTP API's rerank routes answer best first), or
    the best --top-k first ('-': one document from standard input)."""
    documents = read_texts(documents, file, "DOCUMENTS")
    results = call_server(
        endpoints,
        timeout,
        "rerank",
        query,
        documents,
        top_k,
        raw_scores=raw_scores,
        max_chunks_per_doc=max_chunks_per_doc,
    )
    print_results([_result_json(r) for r in results])


@main.command()
@model_option
@endpoint_option
@click.option(
    "--corpus",
    type=click.Path(dir_okay=False),
    help="Texts, one per line (default: stdlib docstring sentences, each sent with its words "
    "shuffled, so that the router's cache seldom answers).",
)
@click.option(
    "--op",
    type=click.Choice(NAMES),
    default="embed",
    show_default=True,
)
@click.option("--pairs", is_flag=True, help="classify: send pairs of corpus texts.")
@click.option(
    "--documents",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="rerank: documents a request (a corpus text as the query, and this many others).",
)
@click.option(
    "--http",
    "url",
    metavar="URL",
    help="Closed loop over HTTP instead: numaserve's own routes (/embed, /embed_sparse, "
    "/embed_all, /predict, /ner, /v1/embeddings: their API's body), or a peer's (any other "
    'path: {"text": ...}).',
)
@click.option(
    "--api-key",
    envvar="NUMASERVE_API_KEY",
    help="--http: sent as Authorization: Bearer KEY (default: $NUMASERVE_API_KEY).",
)
@click.option("--clients", default=32, show_default=True, help="Closed loop: concurrent clients.")
@click.option(
    "--requests", default=1000, show_default=True, help="Closed loop: requests per client."
)
@click.option(
    "--rate", type=float, help="Open loop: requests per second (instead of the closed loop)."
)
@click.option("--duration", type=float, default=30.0, show_default=True, help="Open loop: seconds.")
@click.option(
    "--timeout", default=10.0, show_default=True, help="Seconds before a request counts as failed."
)
@click.option(
    "--retries",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="More tries for a request with no reply, each on another server where there is one "
    "(0: count every miss; a client of a fleet retries).",
)
@click.option(
    "--seed", default=0, show_default=True, help="Seed for drawing texts from the corpus."
)
@json_option
def bench(
    endpoints,
    corpus,
    op,
    pairs,
    documents,
    url,
    api_key,
    clients,
    requests,
    rate,
    duration,
    timeout,
    retries,
    seed,
    as_json,
) -> None:
    """Load a running server and report throughput, latency percentiles and errors."""
    from numaserve.loadgen import bench as load

    _check_bench_options(op, pairs, url, rate)
    texts, draw, source = _bench_texts(corpus, load.drawing(op, pairs, documents))
    servers: Counter[str] = Counter()
    try:
        connect = (
            load.http_target(url, timeout, api_key=api_key, model=asked_model())
            if url
            else load.numaserve_target(
                list(endpoints), op, timeout, client_keys(), asked_model(), retries, servers
            )
        )
    except ValueError as e:
        raise UserError(f"--http: {e}") from None
    total = int(rate * duration) if rate else clients * requests
    before = {} if url else _statuses(endpoints)
    answered_by = [_describe_http(url, api_key)] if url else [_describe(*s) for s in before.items()]
    cache_before = None if url else _cache_counts(before)
    show = not as_json and total >= 200
    with (
        click.progressbar(length=total, label="requests", file=sys.stderr)
        if show
        else _NoBar() as bar
    ):
        if rate:
            result = load.open_loop(
                list(endpoints),
                texts,
                rate,
                duration,
                op,
                timeout,
                bar.update,
                seed,
                draw,
                client_keys(),
                asked_model(),
                retries,
            )
        else:
            label = f"POST {url}" if url else op
            result = load.closed_loop(
                connect, texts, clients, requests, label, bar.update, seed, draw
            )
            result.servers = servers
    if cache_before is not None and (cache_after := _cache_counts(_statuses(endpoints))):
        result.cache = {k: cache_after[k] - cache_before[k] for k in cache_before}
    result.answered_by, result.texts = answered_by, source
    summary = result.summary()
    if as_json:
        print_json(summary)
    else:
        click.echo(load.format_result(summary))
    if summary["requests"] and not summary["ok"]:
        reasons = summary["error_messages"] or {code: "" for code in summary["errors"]}
        why = "; ".join(f"{code}: {message}".rstrip(": ") for code, message in reasons.items())
        raise MachineError(f"every request failed ({why})")


def _bench_texts(corpus: str | None, draw):
    """The texts, how each request draws from them, and where they came from, in words."""
    from numaserve.loadgen import bench as load

    try:
        texts = load.load_corpus(corpus)
    except load.CorpusError as e:
        raise UserError(str(e)) from None
    if corpus:
        return texts, draw, f"{corpus} ({len(texts)} texts)"
    source = f"the built-in corpus ({len(texts)} stdlib sentences, words shuffled per request)"
    return texts, load.with_words_shuffled(draw), source


def _check_bench_options(op: str, pairs: bool, url: str | None, rate: float | None) -> None:
    if url and rate:
        raise UserError("--http drives the closed loop only; leave out --rate")
    if url and (pairs or op == "rerank"):
        raise UserError("--http sends single texts; leave out --pairs and --op rerank")
    if pairs and not TASKS[op].takes_pairs:
        takers = " or ".join(f"--op {name}" for name, task in TASKS.items() if task.takes_pairs)
        raise UserError(f"--pairs is for {takers}")


def _statuses(endpoints) -> dict[str, dict | str]:
    """Each address of the endpoints: its server's status, or why it gave none."""
    from numaserve.client import Client, NumaserveError
    from numaserve.client.endpoints import Endpoints

    statuses: dict[str, dict | str] = {}
    for address in Endpoints(endpoints).addresses:
        try:
            with Client(address, timeout=5, retries=0, curve=client_keys()) as client:
                statuses[address] = client.status()
        except NumaserveError as e:
            statuses[address] = str(e)
    return statuses


def _describe(address: str, status: dict | str) -> str:
    """An address and what answers there: a run against whatever process holds a port should
    say whose figures these are."""
    if isinstance(status, str):
        return f"{address}: no status ({status})"
    try:
        report = ServerReport.from_wire(status)
    except BadReport:
        return f"{address}: a status that is not numaserve's"
    pid = report.supervisor.pid if report.supervisor else None
    return f"{address}: {report.model} ({report.task})" + (f", numaserve pid {pid}" if pid else "")


def _describe_http(url: str, api_key: str | None) -> str:
    """What the server at `url` says it serves (TEI's /info), or that it does not say."""
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    base = f"http://{parts.netloc}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=5)
        conn.request("GET", "/info", headers=headers)
        response = conn.getresponse()
        info = json.loads(response.read()) if response.status == 200 else None
        conn.close()
    except (OSError, http.client.HTTPException, ValueError):
        info = None
    if not isinstance(info, dict) or "model_id" not in info:
        return f"{base}: no /info"
    kind = info.get("model_type")
    task = next(iter(kind), "?") if isinstance(kind, dict) else "?"
    return f"{base}: {info['model_id']} ({task})"


def _cache_counts(statuses: dict[str, dict | str]) -> dict[str, int] | None:
    """The router caches' hits and misses, summed over every server, to tell how many of a
    run's texts they answered; None where a server does not say."""
    hits = misses = 0
    for status in statuses.values():
        try:
            cache = ServerReport.from_wire(status).cache
        except BadReport:
            return None
        hits, misses = hits + cache.hits, misses + cache.misses
    return {"hits": hits, "misses": misses}


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int) -> None:
        pass
