"""Reading traces with bounded memory: a gzip bomb (or an oversized plain trace) is an error, not gigabytes."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from sparsemla import traces

EVENT = {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": 0, "dur": 2.0}


def _padded(pad_bytes: int) -> bytes:
    """A valid chrome trace followed by ``pad_bytes`` of JSON whitespace (compresses about 1000:1)."""
    return json.dumps({"traceEvents": [EVENT]}).encode() + b" " * pad_bytes


def test_gzip_bomb_over_the_limit_is_a_trace_error(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb-TP-0.trace.json.gz"
    bomb.write_bytes(gzip.compress(_padded(8 << 20)))
    assert bomb.stat().st_size < 100_000
    with pytest.raises(traces.TraceError, match=r"more than 1 MiB decompressed"):
        traces.load_events(bomb, max_bytes=1 << 20)
    with pytest.raises(traces.TraceError, match=str(bomb)):
        traces.summarize([bomb], max_bytes=1 << 20)
    assert traces.summarize([bomb], max_bytes=16 << 20).total_us == 2.0  # under the limit it is a valid trace


def test_default_limit_streams_instead_of_decompressing_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = tmp_path / "bomb.trace.json.gz"
    bomb.write_bytes(gzip.compress(_padded(64 << 20)))
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(traces.TraceError, match="decompressed"):
            traces.load_events(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / 2**20:.0f} MiB while reading a 64 MiB bomb with a 1 MiB limit"


def test_plain_trace_over_the_limit_is_a_trace_error(tmp_path: Path) -> None:
    plain = tmp_path / "big.trace.json"
    plain.write_bytes(_padded(2 << 20))
    with pytest.raises(traces.TraceError, match="of JSON"):
        traces.load_events(plain, max_bytes=1 << 20)
    assert traces.load_events(plain, max_bytes=4 << 20) == [EVENT]


def test_default_limit_is_512_mib() -> None:
    assert traces.MAX_TRACE_BYTES == 512 * 2**20


def test_bad_limit_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps({"traceEvents": [EVENT]}))
    with pytest.raises(ValueError, match="max_bytes"):
        traces.load_events(path, max_bytes=0)


def test_find_partial_traces_only_of_the_profile(tmp_path: Path) -> None:
    for name in ("p1-TP-0.trace.json.gz.tmp", "p1-TP-1.trace.json.gz", "p2-TP-0.trace.json.gz.tmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in traces.find_partial_traces(tmp_path, "p1")] == ["p1-TP-0.trace.json.gz.tmp"]
    assert traces.find_partial_traces(tmp_path / "missing", "p1") == []
