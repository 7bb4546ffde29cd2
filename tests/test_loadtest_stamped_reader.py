"""The streamed-body reader stamps each line with the kernel's receive time, not with the time the reader got to it.

A raw-socket server on a free port streams a chunked SSE body, one event every 100 ms, and records when it sent each;
the reader blocks (as a busy load generator would be descheduled) for 40 ms after each event arrives. Stamps must be
within 2 ms of the server's send time, while a read-time stamp would be ~40 ms late.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("geventhttpclient")
from geventhttpclient import HTTPClient  # noqa: E402

from sparsemla.loadtest.stamped_reader import StampedLines, kernel_stamps_supported  # noqa: E402
from sparsemla.procs import free_port  # noqa: E402

GAP_S = 0.1
EVENTS = 4


@contextmanager
def chunked_sse_server() -> Iterator[tuple[int, list[float]]]:
    sent: list[float] = []
    listener = socket.create_server(("127.0.0.1", free_port()))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n"
            )
            start = time.perf_counter()
            for i in range(EVENTS):
                time.sleep(max(0.0, start + (i + 1) * GAP_S - time.perf_counter()))
                body = f"data: {i}\n\n".encode()
                conn.sendall(b"%x\r\n%s\r\n" % (len(body), body))
                sent.append(time.time())
            conn.sendall(b"0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, sent
    finally:
        thread.join(timeout=10)
        listener.close()


@pytest.mark.skipif(not kernel_stamps_supported(), reason="SO_TIMESTAMPNS is Linux-only")
def test_lines_carry_the_kernel_receive_time() -> None:
    with chunked_sse_server() as (port, sent):
        client = HTTPClient("127.0.0.1", port, network_timeout=10)
        wall0, perf0 = time.time(), time.perf_counter()
        response = client.get("/", headers={"Accept": "text/event-stream"})
        lines = StampedLines(response, wall0, perf0)
        assert lines.kernel
        stamps, read_at = [], []
        for i in range(EVENTS):
            # Be late on purpose: read 40 ms after the server has sent the event (waiting for the send itself, not for
            # its schedule: a loaded machine sends late, and an early read would block and not be late at all).
            deadline = time.perf_counter() + 10
            while len(sent) <= i and time.perf_counter() < deadline:
                time.sleep(0.001)
            time.sleep(0.04)
            line, stamp = lines.readline()
            assert line == f"data: {i}\n".encode()
            stamps.append(stamp + (wall0 - perf0))
            read_at.append(time.time())
            assert lines.readline()[0] == b"\n"
        assert lines.readline()[0] == b""  # end of the body
        client.close()
    errors = [abs(stamp - s) for stamp, s in zip(stamps, sent, strict=True)]
    assert max(errors) < 0.002, errors
    assert sum(1 for r, s in zip(read_at, sent, strict=True) if r - s > 0.02) >= 2  # a read-time stamp is late


def test_falls_back_to_readline_without_a_socket() -> None:
    class Plain:
        def __init__(self) -> None:
            self.lines = [b"data: x\n", b"\n", b""]

        def readline(self, sep: bytes) -> bytes:
            assert sep == b"\n"
            return self.lines.pop(0)

    lines = StampedLines(Plain(), time.time(), time.perf_counter())
    assert not lines.kernel
    before = time.perf_counter()
    line, stamp = lines.readline()
    assert line == b"data: x\n" and before <= stamp <= time.perf_counter()
    assert lines.readline()[0] == b"\n" and lines.readline()[0] == b""
