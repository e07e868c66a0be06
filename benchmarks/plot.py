"""Draw the report's plots (docs/img/*.png) from the benchmarks' --json results.

Run:  .venv/bin/python -m benchmarks.plot [--results benchmarks/results] [--out docs/img]
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
    """Throughput and p99 against clients, each server's mean over the rounds, with the model
    alone (one process a CPU, no server) as the ceiling."""
    rounds, settings = data["rounds"], data["settings"]
    levels = [int(c) for c in settings["clients"].split(",")]
    traffic = settings["traffic"].split(",")
    names = settings["systems"].split(",")

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    fig, axes = plt.subplots(2, len(traffic), figsize=(5 * len(traffic), 7), squeeze=False)
    for column, t in enumerate(traffic):
        top, bottom = axes[0][column], axes[1][column]
        for name in names:
            runs = [[r[name][t][str(c)] for r in rounds] for c in levels]
            throughput = [mean([x["throughput_rps"] for x in run]) for run in runs]
            top.plot(levels, throughput, "o-", label=name)
            bottom.plot(levels, [mean([x["latency_ms"]["p99"] for x in run]) for run in runs], "o-")
        limit = mean([r["ceiling"][t]["runs_per_s"] for r in rounds])
        top.axhline(limit, color="grey", linestyle="--", label="the model alone")
        tokens = rounds[0]["ceiling"][t]["tokens"]
        top.set_title(f"{t} texts ({tokens:.0f} tokens on average)")
        top.set_ylabel("requests/s")
        top.set_ylim(bottom=0)
        bottom.set_ylabel("p99 latency, ms (log scale)")
        bottom.set_yscale("log")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.set_xlabel("closed-loop clients")
            ax.grid(True, which="both", alpha=0.3)
        top.legend(loc="lower right", fontsize="small")
    fig.suptitle("Same model file, cores and load: each server against the model alone")
    fig.tight_layout()
    fig.savefig(out / "peers.png", dpi=110)


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
