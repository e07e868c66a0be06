"""numaserve's image (deploy/container), built offline and run the way the kubelet's static CPU
manager runs a Guaranteed pod: inside a cpuset (`--cpuset-cpus`, `--cpuset-mems`), read-only,
as its own user. The plan stays inside the cpuset, each process is pinned (read from /proc
inside the container), and it serves over the published ports: ZeroMQ with CurveZMQ keys,
HTTP with an API key, metrics. SIGTERM drains. Slow (builds the image the first time, then
podman's layer cache): CI runs it in its slow step, as root."""

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from numaserve.client import Client, ClientKeys
from numaserve.host.cpulist import parse_cpulist
from numaserve.testing.ports import free_port
from tests.harness.console import numaserve

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "localhost/numaserve:test"
BASE = "localhost/numaserve-base:bookworm"
MAX_IMAGE_MB = 700  # 666 MB measured: docs/container.md says where it goes

pytestmark = [
    pytest.mark.slow,
    # The first build makes the base (debootstrap) and downloads every wheel: minutes more
    # than the suite's 180 s a test; later builds reuse podman's layers.
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("podman") is None,
        reason="builds and runs the image with podman, as root (.ci/run installs it)",
    ),
]


# Each numaserve process's allowed CPUs, memory nodes and uid, read from /proc inside.
PINNING = (
    "import os, json\n"
    "out = {}\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
    "        status = dict(l.split(':\\t', 1) for l in open(f'/proc/{pid}/status').read().splitlines() if ':\\t' in l)\n"
    "    except OSError:\n"
    "        continue\n"
    "    if any(b'numaserve' in part for part in cmd):\n"
    "        out[pid] = [status['Cpus_allowed_list'].strip(), status['Mems_allowed_list'].strip(), status['Uid'].split()[0]]\n"
    "print(json.dumps(out))\n"
)


@functools.cache
def oci_runtime() -> tuple[str, ...]:
    """The podman option for the OCI runtime this machine needs, if any."""
    out = subprocess.run(
        [str(ROOT / "deploy/container/oci-runtime")], capture_output=True, text=True
    )
    return tuple(out.stdout.split())


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    if args[0] == "run":
        # podman's default limits of open files and processes (about a million and four) are
        # above what this machine lets runc set without CAP_SYS_RESOURCE: ask for fewer, and
        # enough for numaserve.
        args = ("run", "--ulimit=nofile=16384:16384", "--ulimit=nproc=16384:16384", *args[1:])
    out = subprocess.run(
        ["podman", *oci_runtime(), *args], capture_output=True, text=True, timeout=timeout
    )
    if check and out.returncode:
        raise AssertionError(f"podman {' '.join(args)}: {out.returncode}\n{out.stderr[-3000:]}")
    return out


def image_ids() -> set[str]:
    """Every image in podman's store, intermediate ones included."""
    listed = podman("images", "--all", "--quiet", "--no-trunc").stdout.split()
    return {i.removeprefix("sha256:") for i in listed}  # as `image inspect` writes an Id


@dataclasses.dataclass(frozen=True)
class Build:
    tag: str
    # Images the build added, or the one its tag named before, beyond the tag's and the base's.
    left_behind: frozenset[str]


@pytest.fixture(scope="module")
def build() -> Build:
    env = {**os.environ, "PYTHON": sys.executable}  # pip downloads the wheels with this one
    replaced = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout
    before = image_ids() - {replaced.strip()}
    out = subprocess.run(
        [str(ROOT / "deploy/container/build"), IMAGE],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    kept = {
        podman("image", "inspect", "--format", "{{.Id}}", name).stdout.strip()
        for name in (IMAGE, BASE)
    }
    return Build(IMAGE, frozenset(image_ids() - before - kept))


@pytest.fixture(scope="module")
def image(build) -> str:
    return build.tag


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    """The mounts the image's config names: the server's CurveZMQ pair, a client's public key,
    an HTTP API key; readable by the image's user (uid 10001) and no one else."""
    root = tmp_path_factory.mktemp("keys")
    for directory, name in (("curve", "server"), ("client", "billing")):
        out = numaserve("keygen", "--name", name, root / directory)
        assert out.returncode == 0, out.stderr
    (root / "curve-clients").mkdir()
    shutil.copy(root / "client/billing.key", root / "curve-clients/billing.key")
    (root / "http-keys").mkdir()
    (root / "http-keys/keys").write_text("test-api-key-0123456789\n")
    for path in [root, *root.rglob("*")]:
        os.chown(path, 10001, 10001)
    return root


@pytest.fixture(scope="module")
def served(image, keys):
    """The image running on the last CPU this test may use, memory on node 0."""
    cpu = max(os.sched_getaffinity(0))
    ports = {name: free_port() for name in ("zmq", "http", "metrics")}
    name = f"numaserve-test-{os.getpid()}"
    podman(
        "run", "--detach", "--name", name, "--read-only", "--network", "bridge",
        f"--cpuset-cpus={cpu}", "--cpuset-mems=0", "--memory=4g",
        *key_volumes(keys),
        "-p", f"127.0.0.1:{ports['zmq']}:5555", "-p", f"127.0.0.1:{ports['http']}:8080",
        "-p", f"127.0.0.1:{ports['metrics']}:9464",
        image,
    )  # fmt: skip
    try:
        began = time.monotonic()
        wait_ready(name, ports["metrics"])
        print(f"\nready {time.monotonic() - began:.1f} s after podman run (CPU {cpu}, node 0)")
        yield name, cpu, ports
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def key_volumes(keys: Path) -> list[str]:
    """--volume options: the keys where the image's config reads them."""
    mounts = ("curve", "curve-clients", "http-keys")
    return [arg for m in mounts for arg in ("--volume", f"{keys / m}:/etc/numaserve/{m}:ro")]


def wait_ready(name: str, metrics_port: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    logs = podman("logs", name, check=False)
    raise AssertionError(f"not ready in {timeout} s:\n{(logs.stdout + logs.stderr)[-4000:]}")


def client(keys: Path, ports: dict) -> Client:
    curve = ClientKeys.load(keys / "curve/server.key", keys / "client/billing.key_secret")
    return Client(f"tcp://127.0.0.1:{ports['zmq']}", timeout=10, curve=curve)


def test_the_image_is_small_and_holds_no_torch(image):
    size_mb = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout) / 1e6
    print(f"\nimage {image}: {size_mb:.0f} MB")
    assert size_mb < MAX_IMAGE_MB
    find = "import importlib.util as u; print([bool(u.find_spec(m)) for m in MODULES])"
    modules = "MODULES = ['torch', 'ctranslate2', 'onnxruntime']; "
    out = podman("run", "--rm", "--entrypoint", "python3", image, "-c", modules + find).stdout
    assert out.strip() == "[False, True, True]"


def test_a_build_leaves_no_image_behind_but_its_own(build):
    """The build stage (torch, the exporter: 3 GB) and the image a rebuild replaces would
    otherwise stay in podman's store, untagged, and fill the disk a build at a time."""
    assert build.left_behind == frozenset()


def test_each_process_is_pinned_inside_the_cpuset(served):
    name, cpu, _ = served
    processes = json.loads(podman("exec", name, "python3", "-c", PINNING).stdout)
    assert len(processes) >= 3, processes  # supervisor, router, a worker (and HTTP fronts)
    for pid, (cpus, mems, uid) in processes.items():
        assert (cpus, mems, uid) == (str(cpu), "0", "10001"), (pid, cpus, mems, uid)


def test_the_plan_stays_inside_the_cpuset(served, keys):
    _, cpu, ports = served
    with client(keys, ports) as c:
        status = c.status()
    instances = status["instances"]
    assert instances and all(i["state"] == "ready" for i in instances)
    assert {c for i in instances for c in i["cpus"]} == {cpu}


def test_it_serves_over_the_published_zeromq_http_and_metrics_ports(served, keys):
    _, _, ports = served
    with client(keys, ports) as c:
        (embedding,) = c.embed(["a text through the published ZeroMQ port"])
    assert len(embedding.vector) == 384
    headers = {"Authorization": "Bearer test-api-key-0123456789"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{ports['http']}/embed",
        data=json.dumps({"inputs": "a text over HTTP"}).encode(),
        headers={"Content-Type": "application/json", **headers},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert len(json.loads(reply.read())[0]) == 384
    info = urllib.request.Request(f"http://127.0.0.1:{ports['http']}/info", headers=headers)
    with urllib.request.urlopen(info, timeout=10) as reply:
        assert set(json.loads(reply.read())["model_paths"].values()) == {"ctranslate2 int8"}
    with urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=5) as m:
        assert "numaserve_" in m.read().decode()


def test_sigterm_drains_and_the_container_exits_0(served):
    name, _, _ = served
    podman("stop", "--time", "30", name, timeout=60)
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    logs = podman("logs", name).stdout + podman("logs", name).stderr
    assert state["ExitCode"] == 0, logs[-3000:]
    assert "drain" in logs.lower(), logs[-3000:]


def test_a_quota_over_shared_cpus_is_warned_of_and_pinning_stays_inside_them(image, keys):
    """A Kubernetes node without the static CPU manager: the container runs on the shared
    CPUs, held back by a quota. It says so, and still pins inside the CPUs it was given."""
    cpus = sorted(os.sched_getaffinity(0))
    name = f"numaserve-quota-{os.getpid()}"
    metrics = free_port()
    podman(
        "run", "--detach", "--name", name, "--read-only", "--cpus=0.5",
        f"--cpuset-cpus={','.join(map(str, cpus))}", "--cpuset-mems=0",
        *key_volumes(keys), "-p", f"127.0.0.1:{metrics}:9464",
        image,
    )  # fmt: skip
    try:
        wait_ready(name, metrics)
        logs = podman("logs", name).stdout + podman("logs", name).stderr
        assert "0.5 CPUs' worth of time (its cgroup's CPU quota)" in logs, logs[-3000:]
        pinned = podman("exec", name, "python3", "-c", PINNING).stdout
        assert all(set(parse_cpulist(c)) <= set(cpus) for c, _, _ in json.loads(pinned).values())
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
