"""`numaserve status` as a person reads it."""

from __future__ import annotations

from numaserve.cpulist import format_cpulist


def format_status(report: dict) -> str:
    rows = [
        ("instance", "pool", "state", "pid", "cpus", "node", "live affinity", "served", "restarts")
    ]
    for i in report["instances"]:
        live = i.get("live_cpus")
        if live is None:
            affinity = "-"
        else:
            affinity = format_cpulist(live) + (
                " (as planned)" if i.get("affinity_ok") else " (NOT as planned)"
            )
        nodes = i.get("nodes") or []
        rows.append(
            (
                i["name"],
                str(i.get("pool")),
                i.get("state", "?"),
                str(i.get("pid") or "-"),
                format_cpulist(i.get("cpus") or []),
                format_cpulist(nodes) or "-",
                affinity,
                str(i.get("served", 0)),
                str(i.get("restarts", 0)),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append("")
    pools = ", ".join(
        f"{p['name']} (<= {p['max_tokens']} tokens): {p['queue']} queued, {p['ready']} ready"
        for p in report["pools"]
    )
    lines.append(f"pools: {pools}")
    cache = report["cache"]
    lines.append(
        f"cache: {cache['entries']}/{cache['capacity']} entries, hit rate {cache['hit_rate']:.1%} "
        f"({cache['hits']} hits, {cache['misses']} misses)"
    )
    errors = ", ".join(f"{k} {v}" for k, v in sorted(report.get("errors", {}).items())) or "none"
    lines.append(f"errors: {errors}")
    supervisor = report.get("supervisor") or {}
    if supervisor:
        lines.append(f"supervisor: pid {supervisor.get('pid')}, {supervisor.get('state')}")
    return "\n".join(lines)
