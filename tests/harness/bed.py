"""Set-up shared by the test beds that run a suite somewhere else than here: the 2-node
virtual machine (tests/numa_vm.py) and the systemd container (tests/systemd_container.py).
Each step is idempotent and says what it does; what cannot be had is a SetupError naming it."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class SetupError(RuntimeError):
    """A piece of the test bed cannot be had; the message says which and what to do."""


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kwargs)


def ensure_debian_packages(packages: dict[str, str], say) -> None:
    """`packages`: a command each package provides -> the package."""
    missing = sorted({pkg for cmd, pkg in packages.items() if not shutil.which(cmd)})
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SetupError(f"missing {', '.join(missing)}: install them (apt-get install ...)")
    say(f"installing {' '.join(missing)} from Debian")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", *missing], env=env)
    except subprocess.CalledProcessError as e:
        raise SetupError(f"apt-get could not install {' '.join(missing)}:\n{e.stderr}") from None


def ensure_tiny_classifier(path: Path, say) -> Path:
    """A tiny classifier saved at `path`, readable by all: a unit's server runs as the
    numaserve user, and save_pretrained writes model.safetensors for its owner alone (0600)."""
    if not (path / "config.json").exists():
        say("saving a tiny checkpoint for the server")
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        run(
            [
                sys.executable,
                "-c",
                f"from tests.harness.checkpoints import *; save_tiny_classifier({str(tmp)!r})",
            ],
            cwd=REPO,
        )
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
    for file in path.iterdir():
        file.chmod(0o644)
    return path


def parse_arguments(doc: str, timeout: float, timeout_help: str) -> argparse.Namespace:
    """A test bed's command line: --setup-only, --timeout, and pytest's own arguments after
    them (`pytest_args`, a leading `--` dropped)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setup-only", action="store_true", help="set up, do not boot")
    parser.add_argument("--timeout", type=float, default=timeout, help=timeout_help)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="more pytest arguments")
    args = parser.parse_args()
    if args.pytest_args[:1] == ["--"]:
        args.pytest_args = args.pytest_args[1:]
    return args
