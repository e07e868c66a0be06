"""`numaserve start`: what surrounds the supervisor's loop. The plan, made once around the
cores other servers hold, and our entry in the host's core ledger, with the control socket
beside it that `numaserve status` and `stop` find there; the metrics endpoint; the routers'
private runtime directory; all undone in reverse when the loop ends."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import tempfile
from contextlib import ExitStack, nullcontext
from pathlib import Path

from numaserve.config.addresses import split_host_port
from numaserve.config.ports import AS_WRITTEN, Ports
from numaserve.config.schema import Config
from numaserve.host.cpu_quota import cpu_quota, shared_pool_warning
from numaserve.host.ledger import LEDGER_ENV, SYSTEM_DIR, Ledger, held_cpus, ledger_dir, plan_around
from numaserve.host.local_ports import local_port_range, may_be_taken
from numaserve.host.topology import read_topology
from numaserve.monitoring.endpoint import MonitoringEndpoint, MonitoringError
from numaserve.supervisor.arbiter import Supervisor
from numaserve.supervisor.control import ControlSocket
from numaserve.supervisor.processes import System
from numaserve.wire import curve

log = logging.getLogger("numaserve.supervisor")


def start(config_path: str, config: Config, ports: Ports = AS_WRITTEN) -> int:
    """`numaserve start`: plan once, supervise, return the exit code. `config`: read from
    `config_path` by the caller, with `ports` applied (as a reload reads the file again).
    Raises PlacementError, CurveError or MonitoringError for a config that cannot run here
    (before anything starts)."""
    topo = read_topology()
    for warning in topo.warnings:
        log.warning("topology: %s", warning)
    if shared := shared_pool_warning(cpu_quota(), len(topo.allowed_cpus)):
        log.warning("cpus: %s", shared, extra={"event": "cpu_quota"})
    if config.server.curve:  # fail here: a shard or frontend would only exit with it
        curve.server_keys(
            config.server.curve.secret_key_file, config.server.curve.authorized_keys_dir
        )
    directory = ledger_dir()
    if directory is None:
        log.warning(
            "no core ledger: neither $%s, %s nor $XDG_RUNTIME_DIR/numaserve is writable, so "
            "other numaserve servers on this host cannot see this one's CPUs, nor it theirs, "
            "and `numaserve status` and `stop` cannot find its control socket",
            LEDGER_ENV,
            SYSTEM_DIR,
        )
    ledger = Ledger(directory) if directory else None
    with ExitStack() as cleanup:  # undone in reverse: the ledger's entry goes last
        with ledger.locked() if ledger else nullcontext():
            if ledger and (serving := ledger.serving(config_path)):
                raise serving.already_serving(config.server.endpoint)
            # Planned here, with the CLI's clear message if it does not fit.
            topo, plan, holders = plan_around(
                ledger, topo, config.placement, config.models, config.named
            )
            control = None
            if ledger:
                control = open_control(ledger)
                if control is not None:
                    cleanup.callback(control.close)
                ledger.register(
                    os.path.abspath(config_path),
                    held_cpus(plan, topo),
                    config.server.endpoint,
                    str(control.path) if control else "",
                )
                cleanup.callback(ledger.release)
        for holder in holders:
            log.info(
                "planned around another server: %s", holder.describe(), extra={"event": "ledger"}
            )
        # After the plan: a server the ledger refuses says so (exit 75), not that its ports
        # are another's.
        check_front_ports(config)
        monitor = MonitoringEndpoint(config.server.metrics) if config.server.metrics else None
        if monitor is not None:
            cleanup.callback(monitor.close)
        runtime_dir = Path(tempfile.mkdtemp(prefix="numaserve-"))  # the routers' private sockets
        cleanup.callback(_remove, runtime_dir)
        system = System()
        cleanup.callback(system.close)
        if monitor is not None:
            monitor.start()
        supervisor = Supervisor(
            config_path,
            config,
            topo,
            plan,
            runtime_dir,
            system=system,
            monitor=monitor,
            control=control,
            ledger=ledger,
            ports=ports,
        )
        return supervisor.run()


def open_control(ledger: Ledger) -> ControlSocket | None:
    """The control socket beside our ledger entry; None, with a warning, where it cannot be
    made (a Unix socket's path is at most 107 bytes, and $NUMASERVE_LEDGER may be longer):
    the server serves all the same, and `numaserve status` asks it over its endpoint."""
    try:
        return ControlSocket(ledger.control_path())
    except OSError as e:
        log.warning(
            "no control socket at %s (%s): `numaserve stop` cannot find this server; stop it "
            "with SIGTERM, and set %s to a shorter directory",
            ledger.control_path(),
            e.strerror or e,
            LEDGER_ENV,
            extra={"event": "control"},
        )
        return None


def check_front_ports(config: Config) -> None:
    """server.http and server.grpc must be free, and ours alone: the fronts share each by
    SO_REUSEPORT, which would as gladly share it with another server's fronts run by the same
    user. A bind without SO_REUSEPORT fails where any socket holds the port, theirs included.
    The gRPC API needs grpcio's packages, which an installation may leave out (the image)."""
    missing = [m for m in GRPC_MODULES if importlib.util.find_spec(m) is None]
    if config.server.grpc and missing:
        raise MonitoringError(
            f"server.grpc: TEI's gRPC API needs {', '.join(missing)}, which this installation "
            "lacks (the container image leaves grpcio out: docs/container.md); install them, or "
            'set server.grpc to ""'
        )
    for key in ("http", "grpc"):
        if address := getattr(config.server, key):
            _check_port(key, address)


def _check_port(key: str, address: str) -> None:
    host, port = split_host_port(address) or ("", 0)  # the config checked its form
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family[0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(family[4])
    except OSError as e:
        raise MonitoringError(
            f"server.{key}: cannot listen on {address}: {e.strerror or e}; set server.{key} to "
            f'a free host:port, or to "" to turn the {API_NAMES[key]} off'
        ) from None
    if may_be_taken(port):
        low, high = local_port_range()
        log.warning(
            "server.%s: port %d is one this host gives outgoing connections "
            "(net.ipv4.ip_local_port_range %d-%d): one may hold it when a front starts, "
            "which then cannot listen; choose a port below %d, or reserve it "
            "(net.ipv4.ip_local_reserved_ports)",
            key,
            port,
            low,
            high,
            low,
        )


API_NAMES = {"http": "HTTP API", "grpc": "gRPC API"}
# What the gRPC API imports (grpcio, grpcio-tools, grpcio-health-checking, grpcio-reflection).
GRPC_MODULES = ("grpc", "grpc_tools", "grpc_health", "grpc_reflection")


def _remove(runtime_dir: Path) -> None:
    for path in runtime_dir.glob("*"):
        path.unlink(missing_ok=True)
    runtime_dir.rmdir()
