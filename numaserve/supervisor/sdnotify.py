"""systemd's notify protocol (sd_notify), on the real NOTIFY_SOCKET: a unix datagram socket,
named by a path or, with a leading '@', in the abstract namespace. No libsystemd needed."""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends READY=1, STATUS=..., STOPPING=1, WATCHDOG=1; does nothing outside systemd."""

    def __init__(self, environ=os.environ):
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address or None
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        watched = usec.isdigit() and (not pid or pid == str(os.getpid()))
        # systemd's advice: ping at half the timeout.
        self.watchdog_interval = int(usec) / 2e6 if watched else None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if self.address else None

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def notify(self, *fields: str) -> bool:
        if self.sock is None:
            return False
        try:
            self.sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError:
            return False  # systemd went away: nothing to tell

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def reloading(self, status: str) -> bool:
        return self.notify("RELOADING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
