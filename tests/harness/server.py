"""The end-to-end tests' real server: numaserve.testing's, and a client that calls while
something happens to it (`calls_meanwhile`)."""

from __future__ import annotations

import contextlib
import threading

from numaserve.client import Client, NumaserveError
from numaserve.testing.server import ENDPOINT, Server

__all__ = ["ENDPOINT", "Server", "calls_meanwhile"]


@contextlib.contextmanager
def calls_meanwhile(endpoint: str, model: str, op: str, text: str, timeout: float = 30):
    """One client calling `op` of `model` with `text`, call after call, without retries,
    until the block ends: yields the outcome of each call as it comes (`ok`, or the error
    code)."""
    outcomes: list[str] = []
    running = threading.Event()
    running.set()

    def calls() -> None:
        with Client(endpoint, timeout=timeout, retries=0, model=model) as client:
            call = getattr(client, op)
            while running.is_set():
                try:
                    call(text)
                    outcomes.append("ok")
                except NumaserveError as e:
                    outcomes.append(e.code)

    thread = threading.Thread(target=calls)
    thread.start()
    try:
        yield outcomes
    finally:
        running.clear()
        thread.join()
