"""The supervisor's control socket, where `numaserve status` and `numaserve stop` ask the
supervisor on its own host: found in the host's ledger by the endpoint the server serves,
for its user and root only, and proof against what a hostile local peer sends. The socket,
the ledger and the CLI are real; the supervisor behind the socket is on a FAKE OS
(tests/harness/fake_system.py), or a stand-in that answers as one would (said where)."""

import contextlib
import json
import logging
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from numaserve.config.addresses import reaches
from numaserve.host.cpuset import CPUSet
from numaserve.host.ledger import LEDGER_ENV, Ledger
from numaserve.supervisor.control import REQUEST_S, ControlSocket
from numaserve.supervisor.start import open_control
from numaserve.testing.ports import free_port
from numaserve.wire.control import ControlConnection, ControlError
from tests.harness.console import numaserve
from tests.harness.fake_system import Rig


@pytest.fixture
def control(tmp_path):
    made = ControlSocket(tmp_path / "server.sock")
    yield made
    made.close()


def peer(control: ControlSocket) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(str(control.path))
    return sock


def answer_of(sock: socket.socket) -> dict:
    return json.loads(sock.makefile("rb").readline())


def closed(sock: socket.socket) -> bool:
    """Closed by the other end: at once, or with what we sent still unread (a reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# -- which server an endpoint reaches -------------------------------------------------------


@pytest.mark.parametrize(
    ("bound", "asked"),
    [
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
        ("tcp://127.0.0.1:5555", "tcp://localhost:5555"),
        ("tcp://*:5555", "tcp://127.0.0.1:5555"),
        ("tcp://0.0.0.0:5555", "tcp://localhost:5555"),
        ("ipc:///run/numaserve.sock", "ipc:///run/numaserve.sock"),
    ],
)
def test_an_endpoint_of_this_host_reaches_the_server_bound_there(bound, asked):
    assert reaches(bound, asked)


@pytest.mark.parametrize(
    ("bound", "asked"),
    [
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"),  # another port
        ("tcp://*:5555", "tcp://192.0.2.1:5555"),  # another host (TEST-NET-1, not ours)
        ("tcp://127.0.0.1:5555", "tcp://192.0.2.1:5555"),
        ("ipc:///run/a.sock", "ipc:///run/b.sock"),
        ("ipc:///run/a.sock", "tcp://127.0.0.1:5555"),
    ],
)
def test_an_endpoint_elsewhere_does_not(bound, asked):
    assert not reaches(bound, asked)


@contextlib.contextmanager
def entry_of_another_process(directory, endpoint: str, control: str):
    """A ledger entry held by a live process that is not this one, as a server's is."""
    script = (
        "import sys; from pathlib import Path; from numaserve.host.ledger import Ledger; "
        "from numaserve.host.cpuset import CPUSet; "
        f"Ledger(Path({str(directory)!r})).register('/etc/a.yaml', CPUSet.of([0]), {endpoint!r}, "
        f"{control!r}); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait(10)


def test_the_ledger_finds_the_server_an_endpoint_reaches_and_its_control_socket(tmp_path):
    control = str(tmp_path / "a.sock")
    with entry_of_another_process(tmp_path, "tcp://*:6001", control) as pid:
        found = Ledger(tmp_path).serving_at("tcp://localhost:6001")
        assert (found.pid, found.endpoint, found.control) == (pid, "tcp://*:6001", control)
        assert Ledger(tmp_path).serving_at("tcp://localhost:6002") is None


def test_a_dead_servers_control_socket_goes_with_its_entry(tmp_path):
    entry, sock = tmp_path / "server-999999.json", tmp_path / "server-999999.sock"
    entry.write_text('{"pid": 999999, "config": "/a.yaml", "cpus": [0]}')  # nobody locks it
    sock.touch()
    assert Ledger(tmp_path).holders() == []
    assert not entry.exists() and not sock.exists()


# -- the socket, against what a peer sends ---------------------------------------------------


def test_the_socket_is_for_its_user_and_root_only(control):
    assert stat.S_IMODE(os.stat(control.path).st_mode) == 0o600


def test_a_request_is_read_as_it_arrives_without_blocking(control):
    sock = peer(control)
    sock.sendall(b'{"op": "sta')
    assert control.requests(0.0) == []  # half a line: nothing yet, and no wait
    sock.sendall(b'tus"}\n')
    [request] = control.requests(0.1)
    assert request.op == "status"
    request.answer({"status": {}})
    assert answer_of(sock) == {"status": {}}
    sock.close()


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (b"not json\n", "a request is one JSON object a line"),
        (b"[1, 2]\n", "expected a JSON object"),
        (b'{"op": "reboot"}\n', "op: expected one of status, stop, got 'reboot'"),
        (b"x" * 10_000, "a request line is at most 4096 bytes"),
    ],
)
def test_a_bad_request_is_told_why_and_the_socket_serves_on(control, sent, said):
    bad = peer(control)
    bad.sendall(sent)
    assert control.requests(0.0) == []
    assert said in answer_of(bad)["error"]
    assert closed(bad)
    good = peer(control)
    good.sendall(b'{"op": "stop"}\n')
    assert [r.op for r in control.requests(0.0)] == ["stop"]


def test_a_peer_that_sends_nothing_is_closed_after_a_while(control):
    silent = peer(control)
    assert control.requests(0.0) == []
    assert control.requests(REQUEST_S + 0.1) == []
    assert "no request in" in answer_of(silent)["error"]
    assert control.peers == []


@pytest.fixture
def open_directory():
    """A directory anyone may pass through (pytest's own are its user's alone)."""
    path = Path(tempfile.mkdtemp(prefix="numaserve-control-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to connect as another user")
def test_a_peer_of_another_user_is_refused_by_its_credentials(open_directory):
    """The file's mode is the first guard; opened up here, the peer's credentials are the
    second."""
    control = ControlSocket(open_directory / "server.sock")
    os.chmod(control.path, 0o666)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # as nobody
        os.close(read)
        try:
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(str(control.path))
            sock.sendall(b'{"op": "stop"}\n')
            os.write(write, sock.makefile("rb").readline())
        except Exception as e:  # said to the test, which would otherwise see nothing
            os.write(write, repr(e).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        for _ in range(100):
            assert control.requests(0.0) == []
            if _has_data(read):
                break
            time.sleep(0.05)
        answer = b""
        while chunk := os.read(read, 4096):
            answer += chunk
    finally:
        os.waitpid(child, 0)
        control.close()
    assert json.loads(answer) == {"error": "uid 65534 may not control this server"}
    assert control.peers == []


def _has_data(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


# -- the supervisor's answers (FAKE OS) ------------------------------------------------------


def test_status_waits_for_a_fresh_report_from_every_shard(tmp_path, control):
    rig = Rig(tmp_path, control=control)
    rig.start()
    rig.run_for(1.0)
    asked = peer(control)
    rig.router.behind = True  # busy: it has not answered the table that asks yet
    asked.sendall(b'{"op": "status"}\n')
    rig.step()
    table = rig.router.tables[-1]
    assert table["report"] is True  # asked now, not at the next second
    assert _has_data(asked.fileno()) is False
    rig.router.status = replace(rig.router.status, model="answered-after-the-question")
    rig.router.behind = False
    rig.step()
    assert answer_of(asked)["status"]["model"] == "answered-after-the-question"


def test_status_answers_with_what_it_has_when_a_shard_does_not_report(tmp_path, control):
    rig = Rig(tmp_path, control=control)
    rig.start()
    asked = peer(control)
    rig.router.behind = True
    asked.sendall(b'{"op": "status"}\n')
    rig.run_for(2.1)
    assert "instances" in answer_of(asked)["status"]


def test_stop_begins_the_stop_and_its_asker_hears_the_exit_code(tmp_path, control, caplog):
    caplog.set_level(logging.INFO, "numaserve.supervisor")
    rig = Rig(tmp_path, control=control)
    rig.start()
    asked = peer(control)
    asked.sendall(b'{"op": "stop"}\n')
    rig.step()
    answers = asked.makefile("rb")
    assert json.loads(answers.readline()) == {"stopping": 1}  # the supervisor's pid
    assert rig.sup.stopping
    assert f"numaserve stop (pid {os.getpid()}, uid {os.getuid()})" in caplog.text
    for pid in list(rig.os.running):
        rig.os.exit(pid, 0)
    rig.run_for(0.5)
    assert rig.sup.exit_code == 0
    rig.sup.close()
    assert json.loads(answers.readline()) == {"stopped": 0}


# -- the commands ----------------------------------------------------------------------------


def test_stop_of_an_endpoint_no_server_here_serves_says_so(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    out = numaserve("stop", "--endpoint", endpoint, env={LEDGER_ENV: str(tmp_path)})
    assert out.returncode == 1
    assert f"no numaserve server on this host serves {endpoint}" in out.stderr
    assert "lists none" in out.stderr and "nothing was stopped" in out.stderr


def test_the_wait_for_a_stop_is_bounded(tmp_path):
    """A stand-in supervisor: the real socket and ledger entry, in a thread that answers
    `stop` and then never stops."""
    control = ControlSocket(tmp_path / "stand-in.sock")
    ledger = Ledger(tmp_path)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    done = threading.Event()

    def supervise() -> None:
        while not done.wait(0.05):
            for request in control.requests(0.0):
                request.answer({"stopping": os.getpid()}, keep=True)

    thread = threading.Thread(target=supervise)
    ledger.register("/stand-in.yaml", CPUSet.of([0]), endpoint, str(control.path))
    # Our own entry is not ours to the CLI: it is another process, as a supervisor is.
    thread.start()
    try:
        out = numaserve(
            "stop", "--endpoint", endpoint, "--stop-timeout", "1", env={LEDGER_ENV: str(tmp_path)}
        )
    finally:
        done.set()
        thread.join()
        control.close()
        ledger.release()
    assert out.returncode == 1
    assert f"supervisor pid {os.getpid()} is still running after 1 s" in out.stderr


def test_a_closed_control_socket_is_a_clear_error(tmp_path):
    with pytest.raises(ControlError, match="no supervisor listens on"):
        ControlConnection(str(tmp_path / "gone.sock"), timeout=1)


def test_a_ledger_too_deep_for_a_socket_path_leaves_the_server_without_one_and_says_so(
    tmp_path, caplog
):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    assert open_control(Ledger(deep)) is None
    assert "no control socket at" in caplog.text and "AF_UNIX path too long" in caplog.text
