"""Which HTTP server library the HTTP front should run on: each candidate serving the same
minimal JSON route, pinned to one CPU, driven by wrk from the other; requests a second and the
server's CPU time a request, read from /proc (the whole front is to spend at most 60 us a
request, so the library's own share must be well under that).

The candidates run in their own virtual environment, so that numaserve's stays as it is:

    python3 -m venv /tmp/httpbench
    /tmp/httpbench/bin/pip install 'uvicorn[standard]' granian aiohttp httptools uvloop orjson
    apt-get install wrk
    .venv/bin/python -m benchmarks.http_servers --python /tmp/httpbench/bin/python

Each candidate runs `--rounds` times, the candidates alternating, and the median is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CANDIDATES = ("asyncio_httptools", "uvicorn", "granian_rsgi", "granian_asgi", "aiohttp")
BODY = json.dumps({"inputs": "What is the capital of France? A short question, as users send."})
LUA = """wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
"""


# -- the servers: each answers POST /embed {"inputs": text} with {"length": len(text)} --------


def _answer(body: bytes) -> bytes:
    import orjson

    return orjson.dumps({"length": len(orjson.loads(body)["inputs"])})


def serve_asyncio_httptools(port: int) -> None:
    import asyncio

    import httptools
    import uvloop

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.parser, self.body = (
                transport,
                httptools.HttpRequestParser(self),
                [],
            )

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_body(self, body):
            self.body.append(body)

        def on_message_complete(self):
            out = _answer(b"".join(self.body))
            self.body = []
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            )
            self.transport.write(head % len(out) + out)

    async def main():
        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


async def _asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    out = _answer(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


class _Rsgi:
    async def __rsgi__(self, scope, protocol):
        out = _answer(await protocol())
        protocol.response_bytes(200, [("content-type", "application/json")], out)


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        _asgi, host="127.0.0.1", port=port, http="httptools", loop="uvloop", log_level="error",
        access_log=False,
    )  # fmt: skip


def _granian(port: int, interface: str, target: str) -> None:
    from granian import Granian

    Granian(
        target, address="127.0.0.1", port=port, interface=interface, workers=1,
        runtime_threads=1, log_enabled=False,
    ).serve()  # fmt: skip


def serve_granian_rsgi(port: int) -> None:
    _granian(port, "rsgi", "benchmarks.http_servers:RSGI_APP")


def serve_granian_asgi(port: int) -> None:
    _granian(port, "asgi", "benchmarks.http_servers:_asgi")


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def embed(request):
        return web.Response(body=_answer(await request.read()), content_type="application/json")

    app = web.Application()
    app.router.add_post("/embed", embed)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


RSGI_APP = _Rsgi()


# -- the measurement ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds of these processes and their threads."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _tree(pid: int) -> list[int]:
    """The process and its descendants (granian runs its worker as a child)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            children = Path(f"{task}/children").read_text().split()
            todo += [int(c) for c in children]
    return found


def _wait_listening(port: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def measure(python: str, name: str, seconds: int, connections: int, cpus: tuple[int, int]) -> dict:
    port = _free_port()
    server = subprocess.Popen(
        ["taskset", "-c", str(cpus[0]), python, "-m", "benchmarks.http_servers", "--serve", name,
         "--port", str(port)],
        cwd=Path(__file__).parents[1],
    )  # fmt: skip
    try:
        _wait_listening(port)
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
            lua.write(LUA % BODY)
            lua.flush()
            warm = ["taskset", "-c", str(cpus[1]), "wrk", "-t1", f"-c{connections}", "-d1s"]
            subprocess.run([*warm, "-s", lua.name, f"http://127.0.0.1:{port}/embed"], check=True,
                           capture_output=True)  # fmt: skip
            pids = _tree(server.pid)
            before = _cpu_s(pids)
            run = ["taskset", "-c", str(cpus[1]), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
            out = subprocess.run([*run, "--latency", "-s", lua.name, f"http://127.0.0.1:{port}/embed"],
                                 check=True, capture_output=True, text=True).stdout  # fmt: skip
            cpu = _cpu_s(pids) - before
    finally:
        server.terminate()
        server.wait(10)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {
        "candidate": name,
        "requests_per_s": requests / seconds,
        "cpu_us_per_request": cpu / requests * 1e6,
        "p99_ms": float(p99.group(1)) * scale[p99.group(2)] if p99 else None,
        "errors": int(errors.group(1)) if errors else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="has the candidates installed")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--serve", choices=CANDIDATES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        globals()[f"serve_{args.serve}"](args.port)
        return
    cpus = tuple(sorted(os.sched_getaffinity(0)))[:2]
    runs = [
        measure(args.python, name, args.seconds, args.connections, cpus)
        for _ in range(args.rounds)
        for name in CANDIDATES
    ]
    print(f"{'candidate':20} {'requests/s':>11} {'CPU us/request':>15} {'p99 ms':>7}  errors")
    for name in CANDIDATES:
        mine = [r for r in runs if r["candidate"] == name]
        rate = statistics.median(r["requests_per_s"] for r in mine)
        cpu = statistics.median(r["cpu_us_per_request"] for r in mine)
        p99 = statistics.median(r["p99_ms"] for r in mine if r["p99_ms"] is not None)
        errors = sum(r["errors"] for r in mine)
        print(f"{name:20} {rate:11,.0f} {cpu:15.1f} {p99:7.2f}  {errors}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"connections": args.connections, "runs": runs}, indent=1)
        )


if __name__ == "__main__":
    main()
