"""How long `numaserve start` takes to serve: from the command to its `serving on` line, for a
first start (an empty cache: `quantize: auto` chooses, the artifacts are built) and for later
ones (the artifact is there), with the default config, and where the time goes (the log).

    .venv/bin/python -m benchmarks.start_time [--later 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
CONFIG = ROOT / "configs/default.yaml"


def start_once(cache: Path) -> tuple[float, str]:
    """Seconds to `serving on`, and the log up to then."""
    exe = Path(sys.executable).parent / "numaserve"
    env = {**os.environ, "NUMASERVE_CACHE": str(cache)}
    with tempfile.TemporaryFile("w+") as log:
        began = time.perf_counter()
        server = subprocess.Popen(
            [exe, "start", "--config", CONFIG], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            while True:
                log.seek(0)
                text = log.read()
                if "serving on" in text:
                    return time.perf_counter() - began, text
                if server.poll() is not None:
                    raise SystemExit(f"the server exited {server.returncode}:\n{text}")
                time.sleep(0.02)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--later", type=int, default=5, help="later starts to time")
    args = parser.parse_args()
    isa = subprocess.run(
        [Path(sys.executable).parent / "numaserve", "topology"], capture_output=True, text=True
    ).stdout
    print(next(line for line in isa.splitlines() if line.startswith("ISA")))
    with tempfile.TemporaryDirectory() as cache:
        first, log = start_once(Path(cache))
        prepared = [line for line in log.splitlines() if "prepared in" in line]
        said = prepared[-1].split("INFO ")[1] if prepared else "no prepare logged"
        print(f"first start: {first:.2f} s ({said})")
        later = sorted(start_once(Path(cache))[0] for _ in range(args.later))
        print(
            f"later starts: median {later[len(later) // 2]:.2f} s, {later[0]:.2f}-{later[-1]:.2f} s"
        )


if __name__ == "__main__":
    main()
