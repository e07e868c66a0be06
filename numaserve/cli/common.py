"""What every `numaserve` command shares: the group, the errors (a user's mistake prints one
line and exits 2, never a traceback), the options, and the calls to a running server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from numaserve import __version__
from numaserve.host.cpulist import CPUListError, parse_cpulist
from numaserve.host.topology import LIVE_SYSFS, TopologyError, read_topology
from numaserve.processes import exitcodes


class UserError(click.ClickException):
    """A mistake in what the user gave us (config, flags): exit 2, like a usage error."""

    exit_code = 2


class HeldError(click.ClickException):
    """Other servers on this host hold the CPUs this one needs: it may start once one stops
    (EX_TEMPFAIL, so that systemd's Restart=on-failure tries again)."""

    exit_code = 75


class ModelError(click.ClickException):
    """A model that cannot be found: EX_CONFIG, as an instance that cannot load it exits, so
    that systemd does not restart into the same error (RestartPreventExitStatus=78)."""

    exit_code = exitcodes.MODEL


def model_problems(config) -> list[str]:
    """What is wrong with each model's path, checked before anything is planned or started:
    a missing directory is the config's mistake, not an instance's failure seconds later."""
    from numaserve.checkpoint.errors import ModelLoadError
    from numaserve.checkpoint.paths import resolve_model_path

    problems = []
    for i, served in enumerate(config.models):
        try:
            resolve_model_path(served.path)
        except ModelLoadError as e:
            where = f"models[{i}].path" if config.named else "model.path"
            problems.append(f"{config.source}: {str(e).replace('model.path', where, 1)}")
    return problems


class MachineError(click.ClickException):
    """The machine could not be read."""

    exit_code = 1


def read_machine(sysfs_root: str | None, allowed_cpus: str | None, allowed_mems: str | None = None):
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


def print_json(data: dict) -> None:
    click.echo(json.dumps(data, indent=2))


def print_results(results: list[dict]) -> None:
    """`{"results": [...]}` with one line per result: an embedding's numbers stay on its line."""
    lines = ",\n".join(f"  {json.dumps(result)}" for result in results)
    click.echo(f'{{"results": [\n{lines}\n]}}' if results else '{"results": []}')


def read_texts(texts: tuple[str, ...], file: str | None, what: str = "TEXTS") -> list[str]:
    """The texts given: each argument, `-` standing for the whole of standard input as one
    text; then `file`'s non-blank lines, one text each (`-`: standard input's)."""
    if texts.count("-") + (file == "-") > 1:
        raise UserError("standard input can be read once: give '-' or --file -, not both")
    given = [sys.stdin.read().rstrip("\n") if text == "-" else text for text in texts]
    if file is not None:
        try:
            content = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--file: cannot read {file}: {e}") from None
        given += [line for line in content.splitlines() if line.strip()]
    if not given:
        raise UserError(
            f"no text: give {what} as arguments, '-' to read one text from standard input, "
            "or --file FILE (one text per line; --file - reads them from standard input)"
        )
    return given


file_option = click.option(
    "--file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Read texts from FILE, one per line ('-': standard input).",
)


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


def _remember(ctx: click.Context, param: click.Parameter, value):
    ctx.meta[f"numaserve.{param.name}"] = value


_SERVER_OPTIONS = (
    click.option(
        "--endpoint",
        "endpoints",
        multiple=True,
        default=["tcp://127.0.0.1:5555"],
        show_default=True,
        envvar="NUMASERVE_ENDPOINT",
        help="The server's endpoint; repeat it to spread the calls over several servers (a "
        "host name stands for every address it resolves to). "
        "[env: NUMASERVE_ENDPOINT, several separated by spaces]",
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


def asked_model() -> str | None:
    return click.get_current_context().meta.get("numaserve.model")


def client_keys():
    """The ClientKeys of --server-key and --client-key; None without them."""
    from numaserve.wire.curve import ClientKeys, CurveError

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


def call_server(endpoints, timeout: float, method: str, *args, **kwargs):
    from numaserve.client import Client, NumaserveError, Unreachable

    try:
        with Client(
            list(endpoints), timeout=timeout, curve=client_keys(), model=asked_model()
        ) as client:
            return getattr(client, method)(*args, **kwargs)
    except Unreachable as e:
        raise MachineError(
            f"{e.message}. Start one with `numaserve start --config FILE` (or `--model PATH`), "
            "or point --endpoint (or NUMASERVE_ENDPOINT) at the one that runs"
        ) from None
    except NumaserveError as e:
        # The server names the request's key; a person at the command line has the flag.
        message = e.message.replace("name one in `model`", "name one with --model")
        raise MachineError(f"{e.code}: {message}") from None
