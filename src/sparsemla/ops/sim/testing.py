"""Test helpers: run a simulator subprocess on a free port (flags through ``flags.child_env``); a light SSE client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sparsemla import flags
from sparsemla.procs import free_port, stop_child, wait_http


@dataclass(frozen=True)
class RunningSim:
    url: str
    port: int
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def run_sim(
    env: Mapping[str, str | None] | None = None, args: tuple[str, ...] = (), timeout: float = 60.0
) -> Iterator[RunningSim]:
    """Run `sparsemla sim` (through this interpreter) on a free port until the block ends; SIGTERM, then kill."""
    port = free_port()
    argv = [sys.executable, "-c", "from sparsemla.ops.sim.cli import app; app()", "--port", str(port), *args]
    with tempfile.TemporaryDirectory(prefix="sparsemla-sim-") as tmp:
        log = Path(tmp) / "sim.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env=flags.child_env(dict(env or {})), stdout=out, stderr=subprocess.STDOUT)
        sim = RunningSim(f"http://127.0.0.1:{port}", port, proc, log)
        try:
            try:
                wait_http(f"{sim.url}/health", timeout=timeout, pid=proc.pid)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"simulator did not start ({exc}):\n{sim.output()}") from None
            yield sim
        finally:
            stop_child(proc, timeout=30)


@dataclass(frozen=True)
class StreamResult:
    """One streamed completion read by :func:`stream_completions`: its text and when its bytes arrived."""

    status: int
    events: list[dict]  # the JSON events, without the final [DONE]
    done: bool  # the stream ended with `data: [DONE]`
    first_byte: float  # time.monotonic() of the first response byte
    last_byte: float

    @property
    def text(self) -> str:
        return "".join(e["choices"][0]["text"] for e in self.events if e.get("choices"))


def _dechunk(body: bytes) -> bytes:
    """Decode an HTTP/1.1 ``Transfer-Encoding: chunked`` body."""
    out, pos = bytearray(), 0
    while True:
        eol = body.index(b"\r\n", pos)
        size = int(body[pos:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


async def _one_stream(host: str, port: int, payload: bytes) -> StreamResult:
    reader, writer = await asyncio.open_connection(host, port)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip
    writer.write(head + payload)
    buf = bytearray()
    first = last = 0.0
    try:
        while chunk := await reader.read(1 << 16):
            last = time.monotonic()
            first = first or last
            buf += chunk
    finally:
        writer.close()
    header, _, body = bytes(buf).partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in header.lower():
        body = _dechunk(body)
    data = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    done = bool(data) and data[-1] == b"[DONE]"
    events = [json.loads(d) for d in (data[:-1] if done else data)]
    return StreamResult(status, events, done, first, last)


async def stream_completions(url: str, bodies: list[dict]) -> list[StreamResult]:
    """Stream ``/v1/completions`` for every body at once over plain sockets, reading bytes as they come and parsing
    only at the end: a client light enough to hold hundreds of streams on the cores the server also runs on."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    payloads = [json.dumps({**b, "stream": True}).encode() for b in bodies]
    return list(await asyncio.gather(*(_one_stream(host, int(port), p) for p in payloads)))
