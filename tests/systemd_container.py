"""Boot the host's own systemd as PID 1 in a container and run the unit's tests inside it.

    .venv/bin/python -m tests.systemd_container [--setup-only] [--timeout S] [PYTEST ARGS]

The development and CI machines do not run systemd as PID 1; this boots it, as it is, in a
systemd-nspawn container over a read-only view of the host's root with a throw-away overlay
on top, on a private network (its own loopback), and runs tests/test_systemd_unit.py in it
with nsenter: the shipped unit, hardening and all, started, reloaded, watched and stopped by a
real systemd, at native speed. Set-up is idempotent (as root, on Debian): Debian's
systemd-container, a tiny checkpoint for the server to load, and its artifact prepared for this
CPU, as a prepared host or an image built elsewhere has it. Exits with pytest's exit code.
Environment: NUMASERVE_UNIT_CACHE (default .cache/systemd-unit in the checkout).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness import bed
from tests.harness.bed import SetupError

REPO = bed.REPO
CACHE = Path(os.environ.get("NUMASERVE_UNIT_CACHE", REPO / ".cache/systemd-unit"))
VENV_BIN = Path(sys.executable).parent
DEBIAN_PACKAGES = {"systemd-nspawn": "systemd-container", "nsenter": "util-linux"}
MACHINE = "numaserve-unit-test"
# sysinit and the sockets, journald's among them, and none of the host's own services
# (databases, Prometheus): they have no business in this container.
BOOT_TARGET = "basic.target"
BOOT_LOG = CACHE / "last-boot.log"  # the container's console: its systemd's boot and halt
# The unit's config: what a host of any size serves, one instance on each of its cores.
CONFIG = """
model: {{path: "{model}", task: classify, max_length: 64, backend: onnxruntime, quantize: int8}}
server: {{endpoint: "tcp://127.0.0.1:5555", http: ""}}
placement:
  pools: [{{name: main, max_tokens: 64, cores_per_instance: 1, instances: auto}}]
"""


def say(message: str) -> None:
    print(f"systemd-container: {message}", flush=True)


def ensure_config() -> tuple[Path, Path]:
    """The unit's config, and the model it serves."""
    model = bed.ensure_tiny_classifier(CACHE / "tiny-classifier", say)
    config = CACHE / "numaserve.yaml"
    config.write_text(CONFIG.format(model=model))
    config.chmod(0o644)
    return config, model


def ensure_artifacts(config: Path) -> Path:
    """The config's artifacts, prepared for this CPU by `numaserve prepare` (in moments where
    they are built and verified already). The unit's first start finds them in its cache."""
    cache = CACHE / "artifacts"
    say(f"the unit's artifacts, built or verified, in {cache}")
    try:
        bed.run(
            [str(VENV_BIN / "numaserve"), "prepare", "--config", str(config)],
            env={**os.environ, "NUMASERVE_CACHE": str(cache)},
        )
    except subprocess.CalledProcessError as e:
        raise SetupError(
            f"the unit's artifacts could not be prepared:\n{e.stderr[-3000:]}"
        ) from None
    return cache


def nspawn_argv(root: Path) -> list[str]:
    """systemd-nspawn booting the host's tree, bound at `root`: read-only under a tmpfs
    overlay (`--volatile=overlay`), so the tests' users, configs and units vanish with it.
    /tmp is a tmpfs of its own: systemd-tmpfiles empties /tmp at boot. The checkout and the
    Pythons it runs on are bound in read-only, wherever they lie (a bind of / alone shows no
    other file system). No host systemd to register with (`--register=no`, `--keep-unit`)."""
    binds = {REPO, Path(sys.prefix), Path(sys.base_prefix)}
    argv = ["systemd-nspawn", "--quiet", "--directory", str(root), "--volatile=overlay"]
    argv += ["--register=no", "--keep-unit", "--private-network", f"--machine={MACHINE}"]
    argv += ["--tmpfs=/tmp", *(f"--bind-ro={path}" for path in sorted(binds))]
    return [*argv, "--boot", f"systemd.unit={BOOT_TARGET}"]


def container_pid1(nspawn: subprocess.Popen, timeout: float) -> int:
    """The container's PID 1, in our PID namespace: systemd-nspawn's child running systemd."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and nspawn.poll() is None:
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines())
            except (OSError, ValueError):
                continue
            if fields.get("PPid", "").strip() == str(nspawn.pid) and fields["Name"] == "systemd":
                return int(status.parent.name)
        time.sleep(0.2)
    raise SetupError(f"systemd-nspawn started no systemd; its lines:\n{BOOT_LOG.read_text()}")


def enter(pid: int, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """argv run inside the container: its namespaces, its root, this checkout as cwd."""
    chdir = f'cd {shlex.quote(str(REPO))} && exec "$@"'  # nsenter's --wd is the host's path
    argv = ["nsenter", f"--target={pid}", "--all", "sh", "-c", chdir, "sh", *argv]
    return subprocess.run(argv, **kwargs)


def wait_booted(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = enter(pid, ["systemctl", "is-system-running"], capture_output=True, text=True)
        if state.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(0.5)
    raise SetupError(f"the container's systemd did not finish booting in {timeout:.0f} s")


@contextmanager
def host_root() -> Iterator[Path]:
    """The host's root file system bound at a new directory, for systemd-nspawn to boot.
    Unbound and removed with rmdir after: never anything that deletes what lies under it."""
    root = Path(tempfile.mkdtemp(prefix="numaserve-unit-root-"))
    bed.run(["mount", "--bind", "/", str(root)])
    try:
        yield root
    finally:
        bed.run(["umount", "--lazy", str(root)])
        root.rmdir()


@contextmanager
def booted() -> Iterator[int]:
    """A container with the host's systemd booted as its PID 1 (yielded, as our PID), powered
    off after."""
    with host_root() as root, BOOT_LOG.open("w") as log:
        say(f"booting systemd in a container (its console in {BOOT_LOG})")
        nspawn = subprocess.Popen(
            nspawn_argv(root), stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        try:
            pid = container_pid1(nspawn, timeout=60)
            wait_booted(pid, timeout=120)
            yield pid
        finally:
            nspawn.terminate()  # systemd-nspawn asks the container's systemd to power off
            try:
                nspawn.wait(timeout=60)
            except subprocess.TimeoutExpired:
                nspawn.kill()
                nspawn.wait()


def run_tests(
    config: Path, model: Path, artifacts: Path, pytest_args: list[str], timeout: float
) -> int:
    env = {
        "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "NUMASERVE_UNIT_CONFIG": str(config),
        "NUMASERVE_UNIT_MODEL": str(model),
        "NUMASERVE_UNIT_ARTIFACTS": str(artifacts),
    }
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    pytest += ["-m", "systemd_unit", "--durations=0", "tests/test_systemd_unit.py", *pytest_args]
    with booted() as pid:
        say(f"systemd is PID 1 of container {MACHINE}; running the unit's tests")
        try:
            argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *pytest]
            return enter(pid, argv, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            say(f"timed out after {timeout:.0f} s")
            return 1


def main() -> int:
    args = bed.parse_arguments(__doc__, 1200, "seconds for the tests")
    try:
        if os.geteuid() != 0:
            raise SetupError("a container with systemd as PID 1 needs root")
        CACHE.mkdir(parents=True, exist_ok=True)
        bed.ensure_debian_packages(DEBIAN_PACKAGES, say)
        config, model = ensure_config()
        artifacts = ensure_artifacts(config)
        if args.setup_only:
            say(f"ready: config {config}, artifacts {artifacts}")
            return 0
        return run_tests(config, model, artifacts, args.pytest_args, args.timeout)
    except SetupError as e:
        say(f"error: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
