"""CurveZMQ on the client endpoint: real key files, a real router and worker, real handshakes
from the client library, the CLI and raw pyzmq, with good, wrong and missing keys."""

import asyncio
import json
import os
import stat
import subprocess
import sys
import time

import pytest
import zmq

from numaserve.client import AsyncClient, Client, ClientKeys, HandshakeFailed, Timeout
from numaserve.config.schema import ConfigError, parse_config
from numaserve.testing.cluster import Cluster
from numaserve.wire import protocol
from numaserve.wire.curve import CurveError, keygen, read_key_pair, read_public_key
from tests.harness.console import numaserve
from tests.harness.server import Server

CONFIG = """
model: {{backend: onnxruntime, quantize: int8}}
server:
  heartbeat_ms: 200
  curve: {{secret_key_file: "{keys}/server.key_secret", authorized_keys_dir: "{clients}"}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The server's pair, two authorised clients' and a stranger's; the clients' public keys
    in the authorised directory."""
    root = tmp_path_factory.mktemp("keys")
    clients = root / "clients"
    clients.mkdir()
    keygen(root, "server")
    for name in ("billing", "search", "stranger"):
        keygen(root, name)
    for name in ("billing", "search"):
        (clients / f"{name}.key").write_bytes((root / f"{name}.key").read_bytes())
    return root


def client_keys(keys, name: str, server: str = "server") -> ClientKeys:
    return ClientKeys.load(keys / f"{server}.key", keys / f"{name}.key_secret")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, keys):
    config = CONFIG.format(keys=keys, clients=keys / "clients")
    c = Cluster(tmp_path_factory.mktemp("curve"), config, curve=client_keys(keys, "billing"))
    c.start()
    yield c
    c.stop()


def request_counts(cluster) -> dict:
    with cluster.client(timeout=5) as client:
        return client.status()["requests"]


# -- the key files ---------------------------------------------------------------------------


def test_keygen_writes_a_public_key_and_a_pair_only_its_owner_reads(tmp_path):
    public, secret = keygen(tmp_path, "svc")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    pub, sec = read_key_pair(secret, "key")
    assert read_public_key(public, "key") == pub and len(sec) == 40


def test_keygen_never_overwrites_a_key(tmp_path):
    keygen(tmp_path, "svc")
    with pytest.raises(CurveError, match=r"svc\.key exists"):
        keygen(tmp_path, "svc")


def test_the_keygen_command_prints_the_public_key(tmp_path):
    out = numaserve("keygen", tmp_path / "k", "--name", "billing")
    assert out.returncode == 0, out.stderr
    public = read_public_key(tmp_path / "k/billing.key", "key").decode()
    assert f"({public})" in out.stdout and "billing.key_secret" in out.stdout


def test_a_world_readable_key_pair_is_refused_and_a_group_readable_one_taken(tmp_path):
    _, secret = keygen(tmp_path, "svc")
    secret.chmod(0o644)
    with pytest.raises(CurveError, match=r"readable or writable by others.*chmod 600"):
        read_key_pair(secret, "server.curve.secret_key_file")
    secret.chmod(0o640)
    read_key_pair(secret, "server.curve.secret_key_file")


def test_a_public_key_file_is_not_a_key_pair(tmp_path):
    public, _ = keygen(tmp_path, "svc")
    with pytest.raises(CurveError, match="holds only a public key"):
        read_key_pair(public, "client key")


def test_a_key_pair_this_user_cannot_read_is_named_as_such(tmp_path):
    _, secret = keygen(tmp_path, "svc")
    tmp_path.chmod(0o755)
    code = (
        "import os\n"
        "from numaserve.wire.curve import read_key_pair, CurveError\n"
        "os.setgid(65534); os.setuid(65534)  # nobody, once the imports are done\n"
        f"try: read_key_pair({str(secret)!r}, 'key')\n"
        "except CurveError as e: print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "not readable by this user (uid 65534)" in out.stdout, out.stderr


def test_a_malformed_server_key_is_a_clear_error(tmp_path):
    with pytest.raises(CurveError, match="not a Z85 key"):
        read_public_key("~" * 40, "server key")
    with pytest.raises(CurveError, match="not a public key or a key file"):
        read_public_key(tmp_path / "nothing.key", "server key")


# -- the config and `numaserve start` ----------------------------------------------------------


def test_a_plaintext_endpoint_beyond_loopback_needs_curve_or_insecure():
    with pytest.raises(ConfigError, match="can be reached from other hosts, in plaintext"):
        parse_config('server: {endpoint: "tcp://0.0.0.0:5555"}')
    parse_config('server: {endpoint: "tcp://0.0.0.0:5555", insecure: true}')
    curve = "curve: {secret_key_file: s, authorized_keys_dir: d}"
    parse_config(f'server: {{endpoint: "tcp://10.1.2.3:5555", {curve}}}')


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda keys: (keys / "server.key_secret").unlink(), "no such file"),
        (lambda keys: (keys / "server.key_secret").chmod(0o604), "readable or writable by others"),
        (lambda keys: (keys / "clients").rmdir(), "not a directory"),
    ],
)
def test_start_refuses_keys_that_cannot_serve_before_starting_anything(tmp_path, damage, message):
    keygen(tmp_path, "server")
    (tmp_path / "clients").mkdir()
    damage(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.format(keys=tmp_path, clients=tmp_path / "clients"))
    out = numaserve("start", "--config", config)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "server.curve" in out.stderr
    assert "spawn" not in out.stderr


# -- real handshakes -------------------------------------------------------------------------


def test_an_authorised_client_is_served(cluster):
    assert len(cluster.client().embed("hello through curve").vector) == 384


def test_every_authorised_key_is_served_and_the_async_client_too(cluster, keys):
    async def embed():
        async with AsyncClient(cluster.endpoint, curve=client_keys(keys, "search")) as client:
            return await client.embed(["one", "two"])

    assert len(asyncio.run(embed())) == 2


def test_a_stranger_plaintext_and_a_wrong_server_key_get_nothing_and_cost_the_router_nothing(
    cluster, keys
):
    before = request_counts(cluster)
    for keyset in (client_keys(keys, "stranger"), None, client_keys(keys, "billing", "search")):
        with (
            Client(cluster.endpoint, timeout=0.5, retries=1, curve=keyset) as client,
            pytest.raises(HandshakeFailed),
        ):
            client.embed("let me in")
    raw = zmq.Context.instance().socket(zmq.DEALER)  # plaintext, no client library
    raw.linger = 0
    raw.connect(cluster.endpoint)
    for i in range(200):
        raw.send_multipart(protocol.pack({"id": i, "op": "embed", "texts": ["x"]}), zmq.NOBLOCK)
    assert not raw.poll(1000)
    raw.close()
    after = request_counts(cluster)
    assert after["requests"] == before["requests"] + 1  # the status call itself, nothing else
    # raw, kept open for a second, is refused at each reconnect. (A client that gives up at
    # its first refusal may close before the router has read its greeting: a closed
    # connection, then, not a refusal.)
    assert after["refused_handshakes"] >= before["refused_handshakes"] + 1


def test_a_key_added_to_the_directory_is_let_in_at_its_next_connection(cluster, keys, tmp_path):
    keygen(tmp_path, "newcomer")
    newcomer = ClientKeys.load(keys / "server.key", tmp_path / "newcomer.key_secret")
    with Client(cluster.endpoint, timeout=0.5, retries=0, curve=newcomer) as client:
        with pytest.raises(Timeout):
            client.ping()
        added = keys / "clients/newcomer.key"
        added.write_bytes((tmp_path / "newcomer.key").read_bytes())
        try:
            time.sleep(0.01)  # a new mtime for the directory
            os.utime(keys / "clients")
            with Client(cluster.endpoint, timeout=5, retries=0, curve=newcomer) as fresh:
                assert fresh.ping() < 5
        finally:
            added.unlink()
            os.utime(keys / "clients")
    with (
        Client(cluster.endpoint, timeout=0.5, retries=0, curve=newcomer) as removed,
        pytest.raises(Timeout),
    ):
        removed.ping()


def test_the_cli_takes_the_keys_as_options_or_from_the_environment(cluster, keys):
    server, billing = keys / "server.key", keys / "billing.key_secret"
    out = numaserve(
        "embed",
        "hi",
        "--endpoint",
        cluster.endpoint,
        "--server-key",
        server,
        "--client-key",
        billing,
    )
    assert out.returncode == 0, out.stderr
    env = {**os.environ, "NUMASERVE_SERVER_KEY": str(server), "NUMASERVE_CLIENT_KEY": str(billing)}
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    out = subprocess.run(
        [
            exe,
            "bench",
            "--endpoint",
            cluster.endpoint,
            "--clients",
            "2",
            "--requests",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["ok"], summary["errors"]) == (10, {})


def test_the_cli_wants_both_keys_or_none(cluster, keys):
    out = numaserve("status", "--endpoint", cluster.endpoint, "--server-key", keys / "server.key")
    assert out.returncode == 2 and "--server-key and --client-key go together" in out.stderr


SHARDED = """
model: {{backend: onnxruntime, quantize: int8}}
server:
  endpoint: "@ENDPOINT@"
  routers: 2
  curve: {{secret_key_file: "{keys}/server.key_secret", authorized_keys_dir: "{clients}"}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: 2}}]
"""


@pytest.mark.slow
def test_behind_the_frontend_of_two_shards_only_authorised_clients_are_served(tmp_path, keys):
    config = SHARDED.format(keys=keys, clients=keys / "clients")
    server = Server(tmp_path, config, curve=client_keys(keys, "billing"))
    try:
        server.wait_ready()
        with Client(server.endpoint, timeout=10, curve=client_keys(keys, "search")) as client:
            for _ in range(4):  # the frontend hands requests to the shards in turn
                assert len(client.embed(["a", "b", "c"])) == 3
        assert len(server.status()["shards"]) == 2
        for keyset in (client_keys(keys, "stranger"), None):
            with (
                Client(server.endpoint, timeout=0.5, retries=1, curve=keyset) as client,
                pytest.raises(Timeout),
            ):
                client.ping()
    finally:
        server.stop()
