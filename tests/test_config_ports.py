"""`numaserve start --port/--zmq-port/--metrics-port/--grpc-port`: ports moved over the file's, on its hosts,
and the error a taken port gives, naming what the user wrote."""

import socket

import pytest

from numaserve.config.ports import Ports
from numaserve.config.schema import ConfigError, parse_config
from numaserve.testing.ports import free_port
from tests.harness.console import numaserve


def test_each_port_moves_on_the_host_the_config_names():
    config = parse_config(
        'server: {endpoint: "tcp://[::1]:5555", http: "127.0.0.2:8080", metrics: "[::1]:9464"}'
    )
    moved = Ports(http=18080, zmq=15555, metrics=19464).apply(config).server
    assert (moved.endpoint, moved.http, moved.metrics) == (
        "tcp://[::1]:15555",
        "127.0.0.2:18080",
        "[::1]:19464",
    )


def test_a_port_given_for_an_address_the_config_has_off_turns_it_on_at_loopback():
    config = parse_config('server: {http: "", metrics: ""}')
    moved = Ports(http=18080, metrics=19464).apply(config).server
    assert (moved.http, moved.metrics) == ("127.0.0.1:18080", "127.0.0.1:19464")


def test_a_grpc_port_turns_teis_grpc_api_on_at_loopback_or_moves_it():
    assert parse_config("{}").server.grpc == ""  # off by default
    assert Ports(grpc=18081).apply(parse_config("{}")).server.grpc == "127.0.0.1:18081"
    config = parse_config('server: {grpc: "127.0.0.2:8081"}')
    assert Ports(grpc=18081).apply(config).server.grpc == "127.0.0.2:18081"


def test_nothing_moved_is_the_config_as_written():
    config = parse_config("server: {max_batch: 4}")
    assert Ports().apply(config) is config


def test_a_zmq_port_for_an_ipc_endpoint_is_refused():
    config = parse_config('server: {endpoint: "ipc:///run/numaserve.sock"}')
    with pytest.raises(ConfigError, match=r"--zmq-port: server\.endpoint is ipc://"):
        Ports(zmq=6000).apply(config)


@pytest.mark.parametrize(("flag", "key"), [("--metrics-port", "metrics"), ("--grpc-port", "grpc")])
def test_start_with_a_port_taken_names_the_command_and_the_flag_not_a_temp_file(flag, key):
    others = {"--port", "--zmq-port", "--metrics-port"} - {flag}
    ports = [arg for other in sorted(others) for arg in (other, free_port())]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = numaserve("start", "--model", "bundled:minilm", flag, port, *ports, timeout=120)
    assert out.returncode == 2, out.stderr
    said = (
        f"numaserve start --model bundled:minilm: server.{key}: cannot listen on 127.0.0.1:{port}"
    )
    assert said in out.stderr
    assert flag in out.stderr
    assert "numaserve-model-" not in out.stderr  # the file it wrote for itself
