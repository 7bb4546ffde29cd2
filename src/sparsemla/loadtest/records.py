"""One line of ``requests.jsonl`` per request: what the Locust user measured, in a compact JSON form.

Written by the Locust process (the local runner, or the master from its workers' reports), read back by
:mod:`sparsemla.loadtest.summary`. Keys are short because a 60 s run at C=256 writes tens of thousands of lines:

- ``s``: wall-clock send time (seconds since the epoch)
- ``id``: the request id sent as ``X-Request-Id`` (``<pid hex>-<user>-<n>``), to join server-side logs
- ``t``: arrival offsets (seconds after ``s``) of every chunk that carried output tokens; ``t[0]`` is the TTFT
- ``n``: tokens per chunk, present only when some chunk carried more than one
- ``out``: output tokens (server usage count when sent, else counted); ``in``: prompt tokens (usage, else estimate)
- ``e2e``: seconds from send to the end of the stream (or to the failure, or to the cut)
- ``err``: failure kind (``connection|http_error|timeout|sse``) or null; ``msg``: the failure message (a failed
  request keeps its ``t``/``out`` for diagnosis, but its tokens never count as throughput)
- ``cut``: true when the test ended while the request was still streaming (not a failure; its tokens count towards
  throughput inside the measured window, its latencies do not count)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RequestRecord:
    """A measured request (see the module docstring for field meanings; times in seconds)."""

    start: float
    offsets: list[float] = field(default_factory=list)
    chunk_tokens: list[int] | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    e2e: float = 0.0
    error: str | None = None
    message: str | None = None
    cut: bool = False
    request_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cut

    @property
    def ttft(self) -> float | None:
        return self.offsets[0] if self.offsets else None

    def itls(self) -> list[float]:
        t = self.offsets
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first: (e2e - ttft) / (out - 1); None for single-token outputs."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def token_arrivals(self) -> Iterator[tuple[float, float]]:
        """(wall time, tokens) of every output chunk, scaled so the chunks add up to ``output_tokens``."""
        counts = self.chunk_tokens or [1] * len(self.offsets)
        total = sum(counts)
        scale = self.output_tokens / total if total and self.output_tokens and not self.cut else 1.0
        for offset, count in zip(self.offsets, counts, strict=False):
            yield self.start + offset, count * scale

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "s": round(self.start, 6),
            "t": [round(x, 6) for x in self.offsets],
            "out": self.output_tokens,
            "in": self.prompt_tokens,
            "e2e": round(self.e2e, 6),
            "err": self.error,
        }
        if self.chunk_tokens is not None and any(n != 1 for n in self.chunk_tokens):
            data["n"] = self.chunk_tokens
        if self.message:
            data["msg"] = self.message[:300]
        if self.cut:
            data["cut"] = True
        if self.request_id:
            data["id"] = self.request_id
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(
            start=float(data["s"]),
            offsets=[float(x) for x in data.get("t", [])],
            chunk_tokens=[int(x) for x in data["n"]] if "n" in data else None,
            output_tokens=int(data.get("out", 0)),
            prompt_tokens=int(data.get("in", 0)),
            e2e=float(data.get("e2e", 0.0)),
            error=data.get("err"),
            message=data.get("msg"),
            cut=bool(data.get("cut", False)),
            request_id=data.get("id"),
        )


def read_records(path: Path) -> list[RequestRecord]:
    """All records of a ``requests.jsonl`` file; a torn last line (the writer was killed) is skipped."""
    records = []
    if not path.exists():
        return records
    with path.open() as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(RequestRecord.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return records
