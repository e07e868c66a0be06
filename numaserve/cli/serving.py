"""The commands that run or stop a server: start, prepare, keygen, status, stop."""

from __future__ import annotations

import logging
import os
import re
import sys
import typing

import click

from numaserve.cli.common import (
    HeldError,
    MachineError,
    ModelError,
    UserError,
    call_server,
    config_option,
    endpoint_option,
    json_option,
    main,
    model_problems,
    print_json,
    read_machine,
    timeout_option,
)
from numaserve.config.ports import Ports
from numaserve.config.runtimes import needs_prepare
from numaserve.config.schema import (
    MAX_LENGTH,
    MAX_TEXTS,
    ConfigError,
    ModelConfig,
    load_config,
)
from numaserve.host.ledger import AlreadyServedError, CoresHeldError
from numaserve.host.placement import PlacementError
from numaserve.host.topology import TopologyError
from numaserve.processes import exitcodes
from numaserve.tasks import NAMES


def _port_option(name: str, default: int | str, key: str):
    return click.option(
        name,
        type=click.IntRange(1, 65535),
        default=None,
        help=f"Move {key}'s port (over the file's, on its host; --model: on 127.0.0.1; "
        f"default {default}).",
    )


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="YAML config file (see docs/configuration.md).",
)
@click.option(
    "--model",
    "model_path",
    metavar="PATH",
    help="Instead of --config: serve this model with every default (a directory, "
    "bundled:minilm, or a hub id from the local Hugging Face cache).",
)
@click.option(
    "--task",
    type=click.Choice(NAMES),
    default="embed",
    show_default=True,
    help="--model: what the model does.",
)
@click.option(
    "--quantize",
    type=click.Choice(typing.get_args(typing.get_type_hints(ModelConfig)["quantize"])),
    help="--model: model.quantize (default auto: raced at the first start; a named "
    "precision starts at once and is judged against fp32 once).",
)
@click.option(
    "--max-length",
    type=click.IntRange(1, MAX_LENGTH),
    help="--model: model.max_length, the most tokens a text may have (default: the checkpoint's).",
)
@click.option(
    "--max-texts",
    type=click.IntRange(1, MAX_TEXTS),
    help="--model: server.max_texts, the most texts one request may hold (default 2048).",
)
@_port_option("--port", 8080, "server.http (the HTTP API)")
@_port_option("--zmq-port", 5555, "server.endpoint (ZeroMQ)")
@_port_option("--metrics-port", 9464, "server.metrics (/metrics, /healthz, /readyz)")
@_port_option("--grpc-port", "off", "server.grpc (TEI's gRPC API)")
def start(
    config_path: str | None,
    model_path: str | None,
    task: str,
    quantize: str | None,
    max_length: int | None,
    max_texts: int | None,
    port: int | None,
    zmq_port: int | None,
    metrics_port: int | None,
    grpc_port: int | None,
) -> None:
    """Run the server in the foreground until SIGTERM or SIGINT (SIGHUP reloads the config):
    `--config FILE`, or `--model PATH [--task T] [--quantize Q] [--max-length N]
    [--max-texts N]` with no file at all; `--port`, `--zmq-port`, `--metrics-port` and
    `--grpc-port` move a port of either (`--grpc-port` turns TEI's gRPC API on)."""
    from numaserve.monitoring.endpoint import MonitoringError
    from numaserve.processes.logs import setup_logging
    from numaserve.supervisor.start import start as run
    from numaserve.wire.curve import CurveError

    ports = Ports(port, zmq_port, metrics_port, grpc_port)
    settings = {"quantize": quantize, "max_length": max_length, "max_texts": max_texts}
    config_path, where = _config_to_run(config_path, model_path, task, settings, ports)
    try:
        config = ports.apply(load_config(config_path))
    except ConfigError as e:
        raise UserError(str(e).replace(config_path, where)) from None
    if problems := model_problems(config):
        raise ModelError("; ".join(problems).replace(config_path, where))
    _check_api_keys(config.server.http_api_keys_file)
    setup_logging(config.logging.level, config.logging.format)
    try:
        code = run(config_path, config, ports)
    except AlreadyServedError as e:
        raise HeldError(f"{where}: {e}") from None
    except CoresHeldError as e:
        raise HeldError(f"{where}: cannot place: {e}") from None
    except PlacementError as e:
        raise UserError(f"{where}: cannot place: {e}") from None
    except MonitoringError as e:
        raise UserError(
            f"{where}: {e} (or move it: --port, --zmq-port, --metrics-port, --grpc-port)"
        ) from None
    except CurveError as e:
        raise UserError(f"{where}: {e}") from None
    except ConfigError as e:
        raise UserError(str(e)) from None
    except TopologyError as e:
        raise MachineError(str(e)) from None
    sys.exit(code)


def _check_api_keys(path: str | None) -> None:
    """A keys file the HTTP fronts could not serve by, refused before anything starts: a key
    too short would otherwise be dropped in a front's log, and its holder refused with 401."""
    from numaserve.config.keys_file import KeysFileError, read_keys

    if not path:
        return
    try:
        problem = read_keys(path).short_keys_problem(path)
    except KeysFileError as e:
        raise UserError(str(e)) from None
    if problem:
        raise UserError(problem)


def _config_to_run(
    config_path: str | None, model_path: str | None, task: str, settings: dict, ports: Ports
) -> tuple[str, str]:
    """The config file to run, and what an error names: the file the user wrote, or the
    command that wrote one for them (`--model`, whose flags set its keys)."""
    if (config_path is None) == (model_path is None):
        raise UserError("give --config FILE, or --model PATH to serve a model with no file")
    if config_path is not None:
        if given := [k for k, v in settings.items() if v is not None]:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise UserError(f"{flags}: for --model; with --config FILE, set them in the file")
        return config_path, config_path
    ports_given = (ports.http or 8080, ports.zmq or 5555)
    return _model_config(model_path, task, ports_given, **settings), (
        f"numaserve start --model {model_path}"
    )


def _model_config(
    model_path: str,
    task: str,
    ports: tuple[int, int],
    quantize: str | None = None,
    max_length: int | None = None,
    max_texts: int | None = None,
) -> str:
    """The config `start --model` runs, written to a file of this process's own (removed at
    exit) so that the server, its reload and the core ledger see it as they see any other;
    the flags given set their keys, the rest are the defaults."""
    import atexit
    import json
    import tempfile
    from pathlib import Path

    from numaserve.checkpoint.paths import path_against

    model = {"path": path_against(model_path, Path.cwd()), "task": task}
    model |= {k: v for k, v in (("quantize", quantize), ("max_length", max_length)) if v}
    server = {"endpoint": f"tcp://127.0.0.1:{ports[1]}", "http": f"127.0.0.1:{ports[0]}"}
    server |= {"max_texts": max_texts} if max_texts else {}
    config = {"model": model, "server": server}
    fd, name = tempfile.mkstemp(prefix="numaserve-model-", suffix=".yaml")
    with os.fdopen(fd, "w") as file:
        json.dump(config, file)  # JSON is YAML
    atexit.register(os.unlink, name)
    return name


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
    from numaserve.wire.curve import CurveError, read_public_key
    from numaserve.wire.curve import keygen as write_pair

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
@click.option(
    "--record-dir",
    type=click.Path(file_okay=False),
    help="Also write what was resolved for each model here, for the instances to load "
    "(a server's supervisor passes its runtime directory).",
)
@click.option(
    "--for-cpu",
    "for_cpu",
    metavar="FILE|LIST",
    help="Prepare for another CPU: a file `numaserve topology --json` wrote on it, or its ISA "
    "extensions (avx2,avx512f,avx512_vnni,...). Judged and chosen for its extensions, with "
    "this CPU's kernels capped to its; that CPU's starts find the choice kept.",
)
def prepare(config_path: str, record_dir: str | None, for_cpu: str | None) -> None:
    """Resolve each model once, ahead of time (image builds, systemd's ExecStartPre=): each
    pool's model path (`quantize: auto` chooses it) and its artifact, built or verified, so
    that a start never waits for it and a read-only cache serves."""
    from numaserve.backends import prepare_model
    from numaserve.backends.choice import Batching, bands
    from numaserve.processes.lifecycle import PARENT_ENV, die_with_parent
    from numaserve.processes.logs import setup_logging
    from numaserve.processes.specs import record_path

    if PARENT_ENV in os.environ:  # run by a supervisor: not to outlive it
        die_with_parent()

    try:
        config = load_config(config_path)
    except ConfigError as e:
        raise UserError(str(e)) from None
    setup_logging(config.logging.level, config.logging.format)
    isa = read_machine(None, None).isa
    if for_cpu:
        isa = _prepare_for(for_cpu, isa)
    batching = Batching(config.server.max_batch, config.server.max_batch_tokens)
    for i, served in enumerate(config.models):
        where = f"models[{i}]" if config.named else "model"
        if not needs_prepare(served.backend, served.quantize):
            click.echo(f"{where}.backend is torch, quantize {served.quantize}: nothing to prepare")
            continue
        pools = bands(served.pools, served.max_length)
        record = prepare_model(served.model, isa, pools, batching)
        if record is None:
            sys.exit(exitcodes.MODEL)  # the log says why
        if record_dir:
            record.write(record_path(record_dir, served))


def _prepare_for(value: str, here: tuple[str, ...]) -> tuple[str, ...]:
    """The target's ISA extensions, this process running the target's kernels: where its
    environment does not cap them yet, it runs again with the caps (the runtimes read them as
    they load, before any is imported here)."""
    from numaserve.backends.target import TargetError, describe, kernels_for
    from numaserve.host.isa import IsaError, read_isa

    try:
        target = read_isa(value)
        kernels = kernels_for(target, here)
    except (IsaError, TargetError) as e:
        raise UserError(str(e)) from None
    if any(os.environ.get(k) != v for k, v in kernels.items()):
        env = {**os.environ, **kernels}
        os.execve(sys.executable, [sys.executable, "-m", "numaserve.cli", *sys.argv[1:]], env)
    logging.getLogger("numaserve.backends").info(
        describe(target, kernels), extra={"event": "prepare"}
    )
    return target


@main.command()
@endpoint_option
@timeout_option
@json_option
def status(endpoints, timeout: float, as_json: bool) -> None:
    """Show each instance (state, CPUs, live affinity, requests served), pools and the cache.
    A server on this host is asked through its supervisor's control socket; another host's,
    as a client asks it."""
    from numaserve.cli.control import connect, local_server
    from numaserve.status.format import format_status
    from numaserve.status.report import ServerReport
    from numaserve.wire.control import ControlError

    holder = local_server(endpoints)
    if holder is None:
        report = call_server(endpoints, timeout, "status")
    else:
        with connect(holder, timeout) as control:
            try:
                report = control.ask("status")["status"]
            except (ControlError, KeyError) as e:
                raise MachineError(f"the server of pid {holder.pid}: {e}") from None
    if as_json:
        print_json(report)
    else:
        click.echo(format_status(ServerReport.from_wire(report)))


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
    """Stop the server at --endpoint gracefully, as SIGTERM does: asked through its
    supervisor's control socket, on the server's own host, as its user or root."""
    from numaserve.cli.control import connect, local_server, no_local_server
    from numaserve.wire.control import ControlError

    holder = local_server(endpoints)
    if holder is None:
        raise no_local_server(endpoints)
    with connect(holder, timeout) as control:
        try:
            pid = control.ask("stop").get("stopping")
        except ControlError as e:
            raise MachineError(
                f"the server of pid {holder.pid}: {e} (nothing was stopped)"
            ) from None
        click.echo(f"asked the numaserve supervisor (pid {pid}) to stop; it drains, then stops")
        if not wait:
            return
        try:
            end = control.next(stop_timeout)
        except ControlError:
            raise MachineError(
                f"supervisor pid {pid} is still running after {stop_timeout:g} s; "
                "its log says what it is waiting for"
            ) from None
    code = end.get("stopped") if end else None
    click.echo("stopped" + (f" (exit code {code})" if code else ""))
