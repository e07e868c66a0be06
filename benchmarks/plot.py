"""Draw the report's plots (docs/img/*.png) from the benchmarks' --json results.

Run:  .venv/bin/python benchmarks/plot.py [--results benchmarks/results] [--out docs/img]
Reads whichever of ladder.json, peers.json and length_dispatch.json are there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no screen
import matplotlib.pyplot as plt


def ladder(data: dict, out: Path) -> None:
    steps = data["steps"]
    names = [s["step"] for s in steps]
    means = [s["mean_ms"] for s in steps]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.barh(names[::-1], means[::-1], color="#4c72b0")
    for bar, mean in zip(bars, means[::-1], strict=True):
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {mean:.1f} ms ({means[0] / mean:.1f}x)",
            va="center",
        )
    ax.set_xscale("log")
    ax.set_xlabel("mean latency per request, ms (log scale)")
    ax.set_title("The recipe ladder: one request at a time, one core")
    ax.set_xlim(right=max(means) * 8)
    fig.tight_layout()
    fig.savefig(out / "ladder.png", dpi=110)


def peers(data: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    last = data["rounds"][-1]
    for name, result in last.items():
        lat = result["latencies_ms"]
        ax.plot(
            lat,
            [(i + 1) / len(lat) for i in range(len(lat))],
            label=f"{name}: {result['throughput_rps']:.0f} req/s, p99 {result['latency_ms']['p99']:.0f} ms",
        )
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Same model, cores and closed-loop load: latency distribution")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "peers_latency.png", dpi=110)


def length_dispatch(data: dict, out: Path) -> None:
    rates = list(data["rates"])
    fig, ax = plt.subplots(figsize=(8, 4))
    for layout, color in (("length-aware", "C0"), ("length-blind", "C1")):
        for pct, style, marker in (("p50", "--", "o"), ("p99", "-", "s")):
            ax.plot(
                [float(r) for r in rates],
                [data["rates"][r][layout]["short"]["latency_ms"][pct] for r in rates],
                style,
                color=color,
                marker=marker,
                label=f"{layout} {pct}",
            )
    ax.set_xlabel(f"short texts per second (plus {data['args']['long_rate']:g} long/s)")
    ax.set_ylabel("short-request latency, ms")
    ax.set_title("Short requests: length-aware pools against equal instances, same cores")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "length_dispatch.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw in (
        ("ladder", ladder),
        ("peers", peers),
        ("length_dispatch", length_dispatch),
    ):
        path = args.results / f"{name}.json"
        if path.exists():
            draw(json.loads(path.read_text()), args.out)
            print(f"{path} -> {args.out}")


if __name__ == "__main__":
    main()
