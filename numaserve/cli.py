"""The `numaserve` command. Errors a user can fix print one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import click

from numaserve import __version__, exitcodes
from numaserve.config import ConfigError, load_config
from numaserve.host.cpulist import CPUListError, parse_cpulist
from numaserve.host.ledger import CoresHeldError, Ledger, ledger_dir, plan_around
from numaserve.host.placement import PlacementError, format_plan
from numaserve.host.shards import plan_model_shards
from numaserve.host.topology import LIVE_SYSFS, TopologyError, format_topology, read_topology
from numaserve.protocol import AGGREGATIONS, DEFAULT_AGGREGATION


class UserError(click.ClickException):
    """A mistake in what the user gave us (config, flags): exit 2, like a usage error."""

    exit_code = 2


class HeldError(click.ClickException):
    """Other servers on this host hold the CPUs this one needs: it may start once one stops
    (EX_TEMPFAIL, so that systemd's Restart=on-failure tries again)."""

    exit_code = 75


class MachineError(click.ClickException):
    """The machine could not be read."""

    exit_code = 1


def _topology(sysfs_root: str | None, allowed_cpus: str | None, allowed_mems: str | None = None):
    lists = {}
    for option, text in (("--allowed-cpus", allowed_cpus), ("--allowed-mems", allowed_mems)):
        try:
            lists[option] = parse_cpulist(text) if text is not None else None
        except CPUListError as e:
            raise UserError(f"{option}: {e}") from None
    try:
        return read_topology(
            sysfs_root or LIVE_SYSFS,
            allowed_cpus=lists["--allowed-cpus"],
            allowed_mems=lists["--allowed-mems"],
        )
    except TopologyError as e:
        raise MachineError(str(e)) from None


def _print_json(data: dict) -> None:
    click.echo(json.dumps(data, indent=2))


sysfs_option = click.option(
    "--sysfs-root",
    type=click.Path(file_okay=False),
    help="Read the topology from DIR instead of /sys (DIR/devices/system/cpu/...).",
)
allowed_option = click.option(
    "--allowed-cpus",
    metavar="LIST",
    help="Place only on these CPUs (kernel list format, e.g. 0-23,48-71). Default: this "
    "process's affinity on /sys, every online CPU with --sysfs-root.",
)
allowed_mems_option = click.option(
    "--allowed-mems",
    metavar="LIST",
    help="Place only on nodes whose memory this list allows (e.g. 1). Default: this process's "
    "Mems_allowed_list (its cpuset) on /sys, every node with --sysfs-root.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print stable JSON.")
config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="YAML config file (see docs/configuration.md).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="numaserve")
def main() -> None:
    """Serve BERT-like models from pinned, NUMA-local CPU instances."""


@main.command()
@sysfs_option
@allowed_option
@allowed_mems_option
@json_option
def topology(
    sysfs_root: str | None, allowed_cpus: str | None, allowed_mems: str | None, as_json: bool
) -> None:
    """Show sockets, NUMA nodes, physical cores, their types and hardware threads."""
    topo = _topology(sysfs_root, allowed_cpus, allowed_mems)
    ledger = None if sysfs_root else _ledger()
    holders = ledger.holders() if ledger else []
    if as_json:
        held = [h.to_json() for h in holders]
        _print_json({**topo.to_json(), "held": held})
    else:
        held = [f"held by another numaserve server: {h.describe()}" for h in holders]
        click.echo("\n".join([format_topology(topo), *held]))


@main.command()
@config_option
@sysfs_option
@allowed_option
@allowed_mems_option
@json_option
def plan(
    config_path: str,
    sysfs_root: str | None,
    allowed_cpus: str | None,
    allowed_mems: str | None,
    as_json: bool,
) -> None:
    """Show where each instance and router shard of CONFIG would run, without starting anything."""
    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    topo = _topology(sysfs_root, allowed_cpus, allowed_mems)
    for warning in topo.warnings:
        click.echo(f"warning: {warning}", err=True)
    ledger = None if sysfs_root else _ledger()  # other servers run on this machine only
    try:
        topo, result, holders = plan_around(ledger, topo, config.placement, config.models)
        shards = plan_model_shards(result, topo, config.server.routers)
    except PlacementError as e:
        raise UserError(f"{config_path}: cannot place: {e}") from None
    if as_json:
        routers = [{"model": model, **shard.to_json()} for model, shard in shards]
        held = [h.to_json() for h in holders]
        _print_json({**result.to_json(), "routers": routers, "held": held})
    else:
        several = len(result.models) > 1
        routers = [f"{model}: " * several + shard.describe() for model, shard in shards]
        around = [f"planned around another server: {h.describe()}" for h in holders]
        click.echo("\n".join([format_plan(result), *routers, *around]))


def _ledger() -> Ledger | None:
    """This host's core ledger, read only: a command that shows things creates nothing."""
    directory = ledger_dir(create=False)
    return Ledger(directory) if directory else None


def _remember(ctx: click.Context, param: click.Parameter, value):
    ctx.meta[f"numaserve.{param.name}"] = value


_SERVER_OPTIONS = (
    click.option(
        "--endpoint",
        "endpoints",
        multiple=True,
        default=["tcp://127.0.0.1:5555"],
        show_default=True,
        help="The server's endpoint; repeat it to fail over between servers.",
    ),
    click.option(
        "--server-key",
        envvar="NUMASERVE_SERVER_KEY",
        expose_value=False,
        callback=_remember,
        metavar="KEY",
        help="CurveZMQ: the server's public key, or its key file (server.key). "
        "[env: NUMASERVE_SERVER_KEY]",
    ),
    click.option(
        "--client-key",
        envvar="NUMASERVE_CLIENT_KEY",
        expose_value=False,
        callback=_remember,
        metavar="FILE",
        help="CurveZMQ: this client's key pair (NAME.key_secret from numaserve keygen), with "
        "--server-key. [env: NUMASERVE_CLIENT_KEY]",
    ),
)


def endpoint_option(command):
    """--endpoint, and the CurveZMQ keys for a server that has server.curve."""
    for option in reversed(_SERVER_OPTIONS):
        command = option(command)
    return command


timeout_option = click.option("--timeout", default=5.0, show_default=True, help="Seconds per try.")
model_option = click.option(
    "--model",
    expose_value=False,
    callback=_remember,
    metavar="NAME",
    help="The model to ask, by its name in the server's config (default: its only one).",
)


def _model() -> str | None:
    return click.get_current_context().meta.get("numaserve.model")


def _client_keys():
    """The ClientKeys of --server-key and --client-key; None without them."""
    from numaserve.curve import ClientKeys, CurveError

    meta = click.get_current_context().meta
    server, client = meta.get("numaserve.server_key"), meta.get("numaserve.client_key")
    if server is None and client is None:
        return None
    if server is None or client is None:
        raise UserError("--server-key and --client-key go together (CurveZMQ needs both)")
    try:
        return ClientKeys.load(server, client)
    except CurveError as e:
        raise UserError(str(e)) from None


def _call(endpoints, timeout: float, method: str, *args, **kwargs):
    from numaserve.client import Client, NumaserveError

    try:
        with Client(
            list(endpoints), timeout=timeout, curve=_client_keys(), model=_model()
        ) as client:
            return getattr(client, method)(*args, **kwargs)
    except NumaserveError as e:
        raise MachineError(f"{e.code}: {e.message}") from None


def _result_json(result) -> dict:
    from numaserve.client import Embedding, Entities, Ranked

    if isinstance(result, Entities):
        fields = {
            "entities": [
                {k: v for k, v in vars(e).items() if v is not None} for e in result.entities
            ]
        }
    elif isinstance(result, Embedding):
        fields = {"embedding": [round(float(x), 7) for x in result.vector]}
    elif isinstance(result, Ranked):
        fields = {"index": result.index, "score": result.score}
    else:
        fields = {"label": result.label, "probs": list(result.probs)}
    return {**fields, "tokens": result.tokens, "truncated": result.truncated}


@main.command()
@click.argument("texts", nargs=-1, required=True)
@model_option
@endpoint_option
@timeout_option
def embed(texts, endpoints, timeout: float) -> None:
    """Print the embeddings of TEXTS as JSON, one object per text."""
    results = _call(endpoints, timeout, "embed", list(texts))
    _print_json({"results": [_result_json(r) for r in results]})


@main.command()
@click.argument("texts", nargs=-1, required=True)
@click.option(
    "--pairs",
    is_flag=True,
    help="Read TEXTS two by two as pairs (premise, hypothesis), for a model that takes pairs.",
)
@model_option
@endpoint_option
@timeout_option
def classify(texts, pairs: bool, endpoints, timeout: float) -> None:
    """Print the label and probabilities of each of TEXTS (or each pair) as JSON."""
    if pairs and len(texts) % 2:
        raise click.UsageError(f"--pairs needs an even number of texts; got {len(texts)}")
    batch = list(zip(texts[::2], texts[1::2], strict=True)) if pairs else list(texts)
    results = _call(endpoints, timeout, "classify", batch)
    _print_json({"results": [_result_json(r) for r in results]})


@main.command()
@click.argument("texts", nargs=-1, required=True)
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
def ner(texts, aggregation: str, endpoints, timeout: float) -> None:
    """Print the named entities of each of TEXTS as JSON (a server with model.task: ner)."""
    results = _call(endpoints, timeout, "ner", list(texts), aggregation)
    _print_json({"results": [_result_json(r) for r in results]})


@main.command()
@click.argument("query")
@click.argument("documents", nargs=-1, required=True)
@click.option("--top-k", type=click.IntRange(min=1), help="Only the best K, best first.")
@model_option
@endpoint_option
@timeout_option
def rerank(query, documents, top_k: int | None, endpoints, timeout: float) -> None:
    """Print a cross-encoder's score of each of DOCUMENTS for QUERY as JSON, in order, or the
    best --top-k first."""
    results = _call(endpoints, timeout, "rerank", query, list(documents), top_k)
    _print_json({"results": [_result_json(r) for r in results]})


@main.command()
@model_option
@endpoint_option
@click.option(
    "--corpus",
    type=click.Path(dir_okay=False),
    help="Texts, one per line (default: stdlib docstring sentences).",
)
@click.option(
    "--op",
    type=click.Choice(["embed", "classify", "rerank", "ner"]),
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
    help='Closed loop against an HTTP server instead (POST {"text": ...} as JSON), '
    "to measure a peer with the same generator.",
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
    clients,
    requests,
    rate,
    duration,
    timeout,
    seed,
    as_json,
) -> None:
    """Load a running server and report throughput, latency percentiles and errors."""
    from numaserve.loadgen import bench as load

    try:
        texts = load.load_corpus(corpus)
    except load.CorpusError as e:
        raise UserError(str(e)) from None
    if url and rate:
        raise UserError("--http drives the closed loop only; leave out --rate")
    if url and (pairs or op == "rerank"):
        raise UserError("--http sends single texts; leave out --pairs and --op rerank")
    if pairs and op != "classify":
        raise UserError("--pairs is for --op classify")
    draw = load.drawing(op, pairs, documents)
    try:
        connect = (
            load.http_target(url, timeout)
            if url
            else load.numaserve_target(list(endpoints), op, timeout, _client_keys(), _model())
        )
    except ValueError as e:
        raise UserError(f"--http: {e}") from None
    total = int(rate * duration) if rate else clients * requests
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
                _client_keys(),
                _model(),
            )
        else:
            label = f"POST {url}" if url else op
            result = load.closed_loop(
                connect, texts, clients, requests, label, bar.update, seed, draw
            )
    summary = result.summary()
    if as_json:
        _print_json(summary)
    else:
        click.echo(load.format_result(summary))


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int) -> None:
        pass


@main.command()
@config_option
def start(config_path: str) -> None:
    """Run the server in the foreground until SIGTERM or SIGINT (SIGHUP reloads FILE)."""
    from numaserve.curve import CurveError
    from numaserve.logs import setup_logging
    from numaserve.monitoring.endpoint import MonitoringError
    from numaserve.supervisor.arbiter import start as run

    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    setup_logging(config.logging.level, config.logging.format)
    try:
        code = run(config_path, config)
    except CoresHeldError as e:
        raise HeldError(f"{config_path}: cannot place: {e}") from None
    except PlacementError as e:
        raise UserError(f"{config_path}: cannot place: {e}") from None
    except (MonitoringError, CurveError) as e:
        raise UserError(f"{config_path}: {e}") from None
    except ConfigError as e:
        raise UserError(str(e)) from None
    except TopologyError as e:
        raise MachineError(str(e)) from None
    sys.exit(code)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option(
    "--name",
    default="server",
    show_default=True,
    help="The pair's name: NAME.key (public) and NAME.key_secret.",
)
def keygen(directory: str, name: str) -> None:
    """Write a CurveZMQ key pair in DIRECTORY: for the server (server.curve.secret_key_file)
    or for a client service (its NAME.key goes in the server's authorized_keys_dir)."""
    from numaserve.curve import CurveError, read_public_key
    from numaserve.curve import keygen as write_pair

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name.startswith("."):
        raise UserError(f"--name: use letters, digits, '.', '-' or '_'; got {name!r}")
    try:
        public, secret = write_pair(directory, name)
    except (CurveError, OSError) as e:
        raise UserError(str(e)) from None
    click.echo(f"public key: {public} ({read_public_key(public, 'key').decode()})")
    click.echo(f"key pair:   {secret} (mode 0600: keep it secret)")


@main.command()
@config_option
def prepare(config_path: str) -> None:
    """Build or verify each model's ONNX artifact ahead of time (image builds, systemd's
    ExecStartPre=), so that a start never waits for it and a read-only cache serves."""
    from numaserve.backends import prepare_model
    from numaserve.lifecycle import PARENT_ENV, die_with_parent
    from numaserve.logs import setup_logging

    if PARENT_ENV in os.environ:  # run by a supervisor: not to outlive it
        die_with_parent()

    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    setup_logging(config.logging.level, config.logging.format)
    isa = _topology(None, None).isa
    for i, served in enumerate(config.served):
        where = f"models[{i}]" if config.models else "model"
        if served.backend != "onnxruntime":
            click.echo(f"{where}.backend is {served.backend}: nothing to prepare")
        elif not prepare_model(served.model, isa):
            sys.exit(exitcodes.MODEL)  # the log says why


@main.command()
@endpoint_option
@timeout_option
@json_option
def status(endpoints, timeout: float, as_json: bool) -> None:
    """Show each instance (state, CPUs, live affinity, requests served), pools and the cache."""
    from numaserve.router.status import format_status

    report = _call(endpoints, timeout, "status")
    if as_json:
        _print_json(report)
    else:
        click.echo(format_status(report))


@main.command()
@endpoint_option
@timeout_option
@click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait until it has stopped."
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="With --wait: seconds to wait for the stop before giving up (exit 1).",
)
def stop(endpoints, timeout: float, wait: bool, stop_timeout: float) -> None:
    """Stop the server at --endpoint gracefully, as SIGTERM does (it must run on this host)."""
    from numaserve import procinfo

    report = _call(endpoints, timeout, "status")
    supervisor = report.get("supervisor", {})
    pid = supervisor.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        raise MachineError(
            "the server did not say which process supervises it (not started by `numaserve start`?)"
        )
    reported = {k: supervisor.get(k) for k in ("boot_id", "started")}
    if not procinfo.is_process(pid, reported):
        raise MachineError(
            f"the server's supervisor (pid {pid}) is not a process of this host: run "
            "`numaserve stop` on the server's own host (nothing was signalled)"
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise MachineError(f"supervisor pid {pid} is not running on this host") from None
    except PermissionError:
        raise MachineError(
            f"not allowed to signal supervisor pid {pid}: run as its user or root"
        ) from None
    click.echo(f"sent SIGTERM to the numaserve supervisor (pid {pid}); it drains, then stops")
    if wait:
        deadline = time.monotonic() + stop_timeout
        while procinfo.running(pid):
            if time.monotonic() >= deadline:
                raise MachineError(
                    f"supervisor pid {pid} is still running after {stop_timeout:g} s; "
                    "its log says what it is waiting for"
                )
            time.sleep(0.2)
        click.echo("stopped")


if __name__ == "__main__":  # python -m numaserve.cli: how the supervisor runs `prepare`
    main()
