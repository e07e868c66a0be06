"""A cache of a test's own for `quantize: auto`'s choices and verdicts, over the run's artifacts
(tests/conftest.py's NUMASERVE_CACHE): what it keeps is no other test's, and the artifacts are
built once a run."""

from __future__ import annotations

from pathlib import Path


def own_choices(directory: Path) -> Path:
    """`directory` made such a cache: the run's artifacts (ONNX, CTranslate2, OpenVINO's int8)
    linked in, so that a choice made again builds none of them again."""
    from numaserve.backends.artifacts import cache_root

    run_cache = cache_root()
    directory.mkdir(parents=True, exist_ok=True)
    for kind in ("onnx", "ct2", "openvino"):
        (run_cache / kind).mkdir(parents=True, exist_ok=True)
        (directory / kind).symlink_to(run_cache / kind)
    return directory
