"""Read a streamed HTTP body line by line with the kernel's receive time of every line (Linux ``SO_TIMESTAMPNS``).

Why: the load generator runs all users in one thread (gevent). When the machine is busy, the Locust process may be
scheduled milliseconds after a chunk reached its socket, and a ``perf_counter()`` taken after ``readline()`` returns
then adds that delay to TTFT and ITL. With ``SO_TIMESTAMPNS`` set, ``recvmsg`` returns the time the kernel received
the (last) segment it reads, which is when the line became complete, however late the process gets to it. Measured
against the fixture server's own send times at C=64 on 2 busy cores, this removed most of the client-side error
(tests/test_loadtest_e2e.py).

:class:`StampedLines` reimplements geventhttpclient's ``HTTPSocketResponse.readline`` on top of ``recvmsg`` (its
``_sock``, ``_body_buffer``, ``feed`` and ``message_complete``); anything unexpected (another OS, another client
version, a socket option refused) falls back to plain ``readline()`` stamped with ``perf_counter()``.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

# Not exported by Python's socket module before 3.14; 35 on Linux' common architectures (x86, arm, riscv), where the
# control message carries a native struct timespec (two C longs).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@ll")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def kernel_stamps_supported() -> bool:
    return SO_TIMESTAMPNS is not None and _CMSG_SPACE > 0


class StampedLines:
    """Lines of one response body, each with its arrival time in the ``perf_counter()`` clock.

    ``wall0`` / ``perf0`` are ``time.time()`` / ``time.perf_counter()`` read together when the request was sent; they
    map the kernel's wall-clock stamps onto the performance counter. A stamp outside [send time, now] (a wall clock
    step) is replaced by the read time."""

    def __init__(self, response: Any, wall0: float, perf0: float, block_size: int = 65536) -> None:
        self.response = response
        self.offset = wall0 - perf0
        self.wall0 = wall0
        self.block_size = block_size
        self.last_stamp: float | None = None  # perf_counter time of the last segment read
        self.kernel = False
        sock = getattr(response, "_sock", None)
        if (
            kernel_stamps_supported()
            and sock is not None
            and isinstance(getattr(response, "_body_buffer", None), bytearray)
            and hasattr(response, "feed")
        ):
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self.kernel = True
            except (OSError, AttributeError):
                self.kernel = False

    def readline(self) -> tuple[bytes, float]:
        """The next line (with its b"\\n"; b"" at the end of the body) and when it arrived (perf_counter seconds)."""
        if not self.kernel:
            line = self.response.readline(b"\n")
            return line, time.perf_counter()
        resp = self.response
        buffer: bytearray = resp._body_buffer
        while True:
            cut = buffer.find(b"\n")
            if cut >= 0:
                line = bytes(buffer[: cut + 1])
                del buffer[: cut + 1]
                # Bytes that came with the headers (read inside urlopen) have no kernel stamp: stamp them now.
                return line, self.last_stamp if self.last_stamp is not None else time.perf_counter()
            if resp.message_complete:
                return b"", time.perf_counter()
            sock = resp._sock
            if sock is None:
                raise ConnectionError("connection closed")
            try:
                data, ancillary, _flags, _addr = sock.recvmsg(self.block_size, _CMSG_SPACE)
                self.last_stamp = self._stamp(ancillary)
                resp.feed(data)
            except BaseException:
                resp.release()
                raise
            if not data and not resp.message_complete:
                resp.release()
                raise ConnectionError("connection closed before the end of the body")

    def _stamp(self, ancillary: list[tuple[int, int, bytes]]) -> float:
        now = time.perf_counter()
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                stamp = sec + nsec * 1e-9 - self.offset
                if self.wall0 - self.offset - 1e-3 <= stamp <= now:
                    return stamp
        return now
