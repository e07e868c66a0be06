"""Ports an outgoing connection may be given (host/local_ports.py), and the start's warning
for a front configured on one: such a port can be held by a connection of this host's when
the front starts (as a CI run once saw)."""

import logging
import socket
from pathlib import Path

from numaserve.config.schema import parse_config
from numaserve.host.local_ports import local_port_range, may_be_taken
from numaserve.supervisor.start import check_front_ports
from numaserve.testing.ports import free_port


def net(tmp_path: Path, port_range: str, reserved: str = "") -> Path:
    (tmp_path / "ip_local_port_range").write_text(port_range + "\n")
    (tmp_path / "ip_local_reserved_ports").write_text(reserved + "\n")
    return tmp_path


def test_a_port_in_the_local_range_may_be_taken_unless_reserved(tmp_path):
    proc = net(tmp_path, "32768\t60999", "33000-33010,40000")
    assert local_port_range(proc) == (32768, 60999)
    assert may_be_taken(33337, proc) and may_be_taken(60999, proc)
    assert not may_be_taken(8080, proc) and not may_be_taken(61000, proc)
    assert not may_be_taken(33005, proc) and not may_be_taken(40000, proc)


def test_an_unreadable_range_is_linuxs_default(tmp_path):
    assert local_port_range(tmp_path / "missing") == (32768, 60999)


def test_a_front_on_a_port_outgoing_connections_may_take_is_warned_of(caplog):
    low, high = local_port_range()
    port = next(p for p in range(low, high) if may_be_taken(p) and _free(p))
    config = parse_config(f'server: {{http: "127.0.0.1:{port}"}}')
    with caplog.at_level(logging.WARNING, logger="numaserve.supervisor"):
        check_front_ports(config)
    assert f"server.http: port {port} is one this host gives outgoing connections" in caplog.text


def test_a_front_on_a_port_below_the_range_is_not(caplog):
    config = parse_config(f'server: {{http: "127.0.0.1:{free_port()}"}}')
    with caplog.at_level(logging.WARNING, logger="numaserve.supervisor"):
        check_front_ports(config)
    assert "outgoing connections" not in caplog.text


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
