"""Ports `numaserve start` moves from its command line (`--port`, `--zmq-port`,
`--metrics-port`, `--grpc-port`) over what the config says: kept by the supervisor and applied
to every reading of the file, so a reload (SIGHUP) does not move them back."""

from __future__ import annotations

import dataclasses

from numaserve.config.schema import Config, ConfigError

LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class Ports:
    http: int | None = None  # server.http's port; turns the HTTP API on where it is off
    zmq: int | None = None  # server.endpoint's, a tcp:// one
    metrics: int | None = None  # server.metrics'; turns the endpoint on where it is off
    grpc: int | None = None  # server.grpc's; turns TEI's gRPC API on where it is off

    def apply(self, config: Config) -> Config:
        """`config` with these ports, each on the host the config names (127.0.0.1 where it
        has that address off); ConfigError where the endpoint is not a tcp:// one."""
        server, moved = config.server, {}
        if self.http is not None:
            moved["http"] = _with_port(server.http, self.http)
        if self.metrics is not None:
            moved["metrics"] = _with_port(server.metrics, self.metrics)
        if self.grpc is not None:
            moved["grpc"] = _with_port(server.grpc, self.grpc)
        if self.zmq is not None:
            if not server.endpoint.startswith("tcp://"):
                raise ConfigError(
                    f"--zmq-port: server.endpoint is {server.endpoint}, not a tcp:// endpoint "
                    "with a port to move"
                )
            moved["endpoint"] = "tcp://" + _with_port(server.endpoint[6:], self.zmq)
        if not moved:
            return config
        return dataclasses.replace(config, server=dataclasses.replace(server, **moved))


def _with_port(address: str, port: int) -> str:
    """host:port on `address`'s host, as it is written ("[::1]", "*", an interface), or on
    loopback where `address` is empty (the config has it off)."""
    return f"{address.rpartition(':')[0] if address else LOOPBACK}:{port}"


AS_WRITTEN = Ports()  # nothing moved
