"""What a model is built into once and kept on disk for every worker that serves it: an ONNX
graph (onnx_build.py), a CTranslate2 model (ct2_build.py), an OpenVINO int8 model
(openvino_build.py).

An artifact lives at CACHE/KIND/KEY/NAME, where KEY hashes the checkpoint's files and every
option that changes what is built. The first process to need it builds it under the
directory's lock; the others wait and load it. It is built in a child process (which
inherits the caller's CPUs and memory policy, and gives back the gigabytes a torch export
takes when it exits), written under a temporary name and renamed into place, with its
SHA-256 beside it: a file or directory that does not match (a crash mid-copy, a full disk)
is said so and built again.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.processes import exitcodes
from numaserve.processes.prepared import write_atomically

if TYPE_CHECKING:
    from numaserve.backends.base import ModelFacts

log = logging.getLogger("numaserve.backends")
T = TypeVar("T")


def cache_root() -> Path:
    """$NUMASERVE_CACHE, else systemd's CacheDirectory ($CACHE_DIRECTORY), else XDG's."""
    if root := os.environ.get("NUMASERVE_CACHE"):
        return Path(root)
    if root := os.environ.get("CACHE_DIRECTORY"):
        return Path(root.split(":")[0])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "numaserve"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def model_digest(model_dir: Path) -> str:
    """The checkpoint's files, names and contents: what an artifact or a choice was made of."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode() + b"\0")
        digest.update(_sha256(path).encode())
    return digest.hexdigest()


def content_digest(path: Path) -> str:
    """A file's SHA-256, or a directory's files' (model_digest)."""
    return model_digest(path) if path.is_dir() else _sha256(path)


def key_of(model_dir: Path, options: dict, digest: str | None = None) -> str:
    """An artifact's KEY: the checkpoint's files (`digest`, where already known) and the
    options it was built with."""
    key = hashlib.sha256((digest or model_digest(model_dir)).encode())
    key.update(json.dumps(options, sort_keys=True).encode())
    return key.hexdigest()[:32]


def installed_version(package: str) -> str | None:
    """The package's installed version, from its metadata (importing it would cost a worker
    memory it never uses); None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def checkpoint_key(
    model_dir: Path, config: ModelConfig, full_range: bool, options: dict, digest: str | None
) -> str:
    """KEY of an artifact built from the checkpoint for the config's task: its files, the
    task, the CPU's int8 range (`full_range`), whether the graph takes token types, and the
    builder's own `options`."""
    from numaserve.backends.base import ModelFacts, uses_token_types  # numpy: not the router's
    from numaserve.tasks import TASKS

    options = {"task": config.task, "full_range": full_range, **options}
    if uses_token_types(TASKS[config.task], ModelFacts.read(model_dir).type_vocab_size):
        options["token_type_ids"] = True  # an input of the graph
    return key_of(model_dir, options, digest)


def built_in_child(
    kind: str, key: str, name: str, build: Build, root: Path | None, full_range: bool
) -> Path:
    """CACHE/KIND/KEY/NAME, built by `build` (told the CPU's int8 range) if missing."""
    args = ["--full-range"] if full_range else []
    build = dataclasses.replace(build, args=(*build.args, *args))
    return ensure((root or cache_root()) / kind / key, name, build)


def prepared_artifact(path: str) -> Path:
    """An artifact `numaserve prepare` built and verified, as an instance is told it."""
    if not Path(path).exists():
        raise ModelLoadError(
            f"the prepared artifact {path} is missing (the cache was cleared or moved after "
            "`numaserve prepare` ran): restart the server, or run `numaserve prepare` again"
        )
    return Path(path)


def prepared(config: ModelConfig, artifact: str | None) -> tuple[Path, ModelFacts]:
    """The artifact `numaserve prepare` built (as an instance is told it) and the checkpoint's
    facts, checked against the config: an instance loads, and never builds."""
    from numaserve.backends.base import ModelFacts  # numpy: not the router's

    facts = ModelFacts.read(Path(resolve_model_path(config.path)))
    facts.check(config)
    if artifact is None:
        raise ModelLoadError(
            f"model.backend {config.backend} loads the artifact `numaserve prepare` builds, "
            "and none was named: run `numaserve prepare`, or start with `numaserve start`"
        )
    return prepared_artifact(artifact), facts


def checkpoint_artifact(config: ModelConfig, make: Callable[[Path], Path]) -> Path:
    """`make(checkpoint directory)`'s artifact, built now if missing (prepare, `auto`'s
    judging, tune's probes), the checkpoint checked against the config first: a build
    can take minutes."""
    from numaserve.backends.base import ModelFacts
    from numaserve.tasks import TASKS

    directory = Path(resolve_model_path(config.path))
    ModelFacts.read(directory).check(config)
    TASKS[config.task].check_checkpoint(directory, config.path)
    return make(directory)


@dataclasses.dataclass(frozen=True)
class Build:
    """How an artifact is made: `python -m MODULE CONFIG OUTPUT ARGS`, whose last line on
    stderr says why where it fails (the module's main)."""

    what: str  # "the ONNX artifact", in messages
    module: str
    config: ModelConfig
    args: Sequence[str] = ()


def kept_or_made(
    directory: Path,
    lock_name: str,
    read: Callable[[], T | None],
    make: Callable[[], T],
    cannot: Callable[[OSError], Exception],
) -> T:
    """What `read` finds kept in `directory`; else, under the directory's lock `lock_name`
    (one maker; the others wait, then read what it made), `read` once more, then `make`.
    `cannot`: the error for a directory that cannot be written (a read-only cache)."""
    if (kept := read()) is not None:  # no lock, no write: a read-only cache serves
        return kept
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = (directory / lock_name).open("w")
    except OSError as e:
        raise cannot(e) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (kept := read()) is not None:
            return kept
        return make()


def ensure(directory: Path, name: str, build: Build) -> Path:
    """directory/name, built first if it is missing or does not match its digest."""
    artifact, digest = directory / name, directory / f"{name}.sha256"

    def verified() -> Path | None:
        return artifact if _verified(artifact, digest) else None

    def made() -> Path:
        if artifact.exists():
            log.warning("%s %s does not match its digest: rebuilding it", build.what, artifact)
            _remove(artifact)
        _remove_leftovers(directory)
        log.info("building %s for %s in %s", build.what, build.config.path, directory)
        built = directory / f"{name}.{os.getpid()}.tmp"
        _build_in_child(build, built)
        write_atomically(digest, content_digest(built))
        os.replace(built, artifact)
        return artifact

    def cannot(e: OSError) -> ModelLoadError:
        return ModelLoadError(
            f"{build.what} {artifact} is missing or damaged, and it cannot be built "
            f"there: {e.strerror}. Run `numaserve prepare --config FILE` where the cache is "
            "writable, or point NUMASERVE_CACHE at a writable directory"
        )

    return kept_or_made(directory, ".lock", verified, made, cannot)


def _verified(artifact: Path, digest: Path) -> bool:
    """Complete: a builder writes the digest and then renames the artifact into place, so an
    artifact that matches its digest was finished, whoever reads it and whether locked or not."""
    try:
        return artifact.exists() and digest.read_text().strip() == content_digest(artifact)
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_leftovers(directory: Path) -> None:
    """What a build killed midway left behind. Only lock holders build, and we hold it."""
    for path in [*directory.glob("build-*"), *directory.glob("*.tmp")]:
        _remove(path)


# A build child's exit code where it refused the model (a ModelLoadError, in one line), not
# failed: its parent raises that line without logging the output as a build error.
REFUSED = 3


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """How a child process (`run_child`) ended: its exit status and its stderr's lines."""

    returncode: int
    lines: list[str]

    def failure(self, name: str) -> str:
        """Why it failed, in one line: the signal that killed it, else its last stderr line."""
        if self.returncode < 0:
            return f"{name} was killed by {exitcodes.signal_name(-self.returncode)}"
        return self.lines[-1] if self.lines else f"{name} exited {self.returncode}"


def run_child(module: str, *args: str) -> ChildRun:
    """`python -m MODULE ARGS --parent=PID`: a child that dies with this process (its main
    calls `die_with_parent`), so a prepare killed midway (a start timeout, a stop) leaves no
    build running."""
    command = [sys.executable, "-m", module, *args, f"--parent={os.getpid()}"]
    child = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return ChildRun(child.returncode, [line for line in child.stderr.splitlines() if line.strip()])


def _build_in_child(build: Build, output: Path) -> None:
    config = json.dumps(dataclasses.asdict(build.config))
    child = run_child(build.module, config, str(output), *build.args)
    if child.returncode == 0 and output.exists():
        return
    _remove(output)
    if child.lines and child.returncode != REFUSED:  # a refusal's one line is the whole story
        log.error("the build's output:\n%s", "\n".join(child.lines[-40:]))
    raise ModelLoadError(child.failure("the build process"))


def build_main(argv: list[str] | None, module: str, build, failure: str) -> int:
    """A build child's main: `build(transformers_model, config, output, full_range)` on the
    checkpoint loaded in fp32 for its task. Its last stderr line is what the caller reports:
    a ModelLoadError's words, else `failure` (which names the way out) with the cause."""
    import argparse
    import signal
    import traceback

    from numaserve.processes.lifecycle import die_with_parent

    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("config", help="the model config, as JSON")
    parser.add_argument("output", type=Path)
    parser.add_argument("--parent", type=int, help="die with this process")
    parser.add_argument("--full-range", action="store_true", help="8-bit int8 activations")
    args = parser.parse_args(argv)
    if args.parent:  # a build whose worker was killed (a start timeout, a stop) must not go on
        die_with_parent(args.parent, signal.SIGKILL)
    config = ModelConfig(**json.loads(args.config))
    try:
        from numaserve.backends.torch import load_transformers_model

        build(load_transformers_model(config), config, args.output, args.full_range)
    except ModelLoadError as e:
        print(e, file=sys.stderr)
        return REFUSED
    except Exception as e:  # the traceback for the log, then the one line the worker reports
        traceback.print_exc()
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        cause = f"{type(e).__name__}: {first_line}"
        print(failure.format(path=config.path, cause=cause), file=sys.stderr)
        return 1
    return 0
