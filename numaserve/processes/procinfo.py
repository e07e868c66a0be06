"""Who a pid is on this host: the kernel's boot id and the process's start time.

The supervisor reports its pid with both in its status: a pid alone may be another host's,
or, after a restart, a different process's.
"""

from __future__ import annotations

from pathlib import Path

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields from the third (state) on; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return stat.rpartition(")")[2].split()


def start_ticks(pid: int | str) -> int | None:
    """The process's start time in clock ticks after boot (field 22 of /proc/PID/stat);
    None if there is no such process."""
    fields = _stat(pid)
    return None if fields is None else int(fields[19])


def identity(pid: int | str = "self") -> dict:
    return {"boot_id": boot_id(), "started": start_ticks(pid)}
