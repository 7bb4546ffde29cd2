"""End-to-end load tests against a real HTTP server with injected latencies (tests/test_loadtest_sse_server.py).

Each test starts the fixture server on a free port, runs headless Locust through `sparsemla.loadtest.runner` and checks
the summary: timing accuracy at C=64, failure classification, multi-process aggregation of records and client
Prometheus metrics, and a two-point sweep + compare with the report files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from sparsemla import metric_names as mn
from sparsemla.loadtest.records import read_records
from sparsemla.loadtest.report import NO_DIFFERENCE, compare_runs, load_run, write_report
from sparsemla.loadtest.runner import LoadTestConfig, run_point
from sparsemla.loadtest.sweep import run_sweep
from sparsemla.procs import free_port, stop_child, wait_http

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).with_name("test_loadtest_sse_server.py")


@contextmanager
def fixture_server(*args: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FIXTURE), "--port", str(port), *args])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=30, pid=proc.pid)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_child(proc, timeout=10)


def _config(url: str, concurrency: int, **kw) -> LoadTestConfig:
    return LoadTestConfig(target=url, concurrency=concurrency, metrics_port=free_port(), **kw)


def _server_truth(url: str) -> dict[str, dict]:
    """Per request id: the client's send time and when the fixture handed each output chunk to the socket."""
    with urllib.request.urlopen(f"{url}/fixture/timings", timeout=30) as resp:
        return json.loads(resp.read())["requests"]


def test_ttft_and_itl_within_2ms_of_the_server_at_c64(tmp_path: Path) -> None:
    """C=64 on a 2-core machine: the client's TTFT and ITL (p50, and the ITL mean) within 2 ms of what the server did.

    The server's own send times are the truth, not the injected schedule: under load the fixture's event loop runs
    late by milliseconds (that is the server being slow, which the client must report, not a client error). Requests
    are joined by X-Request-Id; the windows and filters are the summary's (tests below check it too)."""
    ttft, itl = 0.15, 0.08
    with fixture_server("--ttft", str(ttft), "--itl", str(itl)) as url:
        cfg = _config(url, 64, duration_s=6, warmup_s=2, workload="random:16:12", api="completions")
        s = run_point(cfg, tmp_path / "c64", "accuracy")
        truth = _server_truth(url)
    assert s["failures"]["total"] == 0
    assert s["requests"] > 100
    timeline = json.loads((tmp_path / "c64" / "timeline.json").read_text())
    start, stop = timeline["measure_start"], timeline["stop"]
    records = [r for r in read_records(tmp_path / "c64" / "requests.jsonl") if r.error is None]
    assert records and all(r.request_id in truth for r in records)

    # TTFT: requests sent in the window whose first token came before the stop (the summary's selection).
    ttft_pairs = [
        (r.ttft, truth[r.request_id]["sent"][0] - truth[r.request_id]["client_sent"])
        for r in records
        if start <= r.start < stop and r.ttft is not None and r.start + r.ttft <= stop
    ]
    client_ttft, server_ttft = (np.array(x) for x in zip(*ttft_pairs, strict=True))
    assert s["ttft_s"]["p50"] == pytest.approx(np.percentile(client_ttft, 50), abs=1e-6)  # same selection
    # ITL: every gap closing inside the window; a request cut at the stop may miss the server's last send time.
    itl_pairs = [
        (r.offsets[k] - r.offsets[k - 1], sent[k] - sent[k - 1])
        for r in records
        for sent in [truth[r.request_id]["sent"]]
        for k in range(1, min(len(r.offsets), len(sent)))
        if start <= r.start + r.offsets[k] <= stop
    ]
    client_itl, server_itl = (np.array(x) for x in zip(*itl_pairs, strict=True))
    summary_itl = [g for r in records for k, g in enumerate(r.itls(), 1) if start <= r.start + r.offsets[k] <= stop]
    assert s["itl_s"]["p50"] == pytest.approx(np.percentile(summary_itl, 50), abs=1e-6)
    assert len(itl_pairs) >= 0.99 * len(summary_itl) > 1000

    def ms(x: float) -> str:
        return f"{x * 1000:.3f} ms"

    errors = {
        "TTFT p50": np.percentile(client_ttft, 50) - np.percentile(server_ttft, 50),
        "ITL p50": np.percentile(client_itl, 50) - np.percentile(server_itl, 50),
        "ITL mean": client_itl.mean() - server_itl.mean(),
        "per-request TTFT (median |error|)": np.median(np.abs(client_ttft - server_ttft)),
    }
    assert all(abs(e) < 0.002 for e in errors.values()), {k: ms(v) for k, v in errors.items()}
    # The fixture did inject what it says (never early; late by at most what a busy machine explains).
    assert ttft - 0.0005 <= np.percentile(server_ttft, 50) < ttft + 0.05, ms(np.percentile(server_ttft, 50))
    assert abs(server_itl.mean() - itl) < 0.01, ms(server_itl.mean())
    # Throughput counts the tokens that arrived in the window: the server sent as many (edges: a few in flight).
    sent_in_window = sum(1 for t in truth.values() for x in t["sent"] if start <= x < stop)
    assert s["output_tokens"] == pytest.approx(sent_in_window, rel=0.03)
    for key in ("concurrency", "duration_s", "requests", "failures", "output_tokens", "output_tok_per_s", "req_per_s",
                "ttft_s", "itl_s", "tpot_s", "e2e_s", "goodput", "server", "server_flags"):  # fmt: skip
        assert key in s, key
    assert s["server_flags"]["sparsemla_mma_decode"] == "off" and s["server"]["model_path"] == "fixture/sse"
    assert json.loads((tmp_path / "c64" / "summary.json").read_text())["requests"] == s["requests"]
    assert (tmp_path / "c64" / "locust_stats.csv").read_text().count("TTFT") >= 1
    assert (tmp_path / "c64" / "locust.html").exists()


def test_failures_are_counted_by_kind(tmp_path: Path) -> None:
    args = ("--ttft", "0.02", "--itl", "0.01", "--fail-every", "5", "--malformed-every", "7", "--drop-every", "11",
            "--hang-every", "13")  # fmt: skip
    with fixture_server(*args) as url:
        cfg = _config(url, 8, duration_s=5, warmup_s=1, workload="random:8:10", request_timeout_s=1.0)
        s = run_point(cfg, tmp_path / "fail", "failures")
    f = s["failures"]
    assert f["http_error"] > 0 and f["sse"] > 0 and f["timeout"] > 0, f
    assert f["connection"] + f["sse"] > f["sse"] - 1  # drops surface as connection errors or truncated streams
    assert f["total"] == sum(v for k, v in f.items() if k != "total")
    assert s["failures_marked"] and s["failure_rate"] > 0.1
    assert any(m.startswith("[timeout]") for m in s["failure_examples"]) or f["timeout"] > 0
    failures_csv = (tmp_path / "fail" / "locust_failures.csv").read_text()
    assert "[http_error] HTTP 500" in failures_csv and "[sse]" in failures_csv


def test_processes_aggregate_records_and_client_metrics(tmp_path: Path) -> None:
    """--processes 2: both workers' requests reach the summary and one metrics port sums both processes."""
    scraped: list[str] = []
    with fixture_server("--ttft", "0.03", "--itl", "0.02") as url:
        cfg = _config(url, 6, duration_s=4, warmup_s=1, workload="random:8:8", processes=2, api="generate")

        def on_progress(phase: str, elapsed: float, total: float, requests: int) -> None:
            if phase == "measuring" and not scraped and elapsed > 3:
                with urllib.request.urlopen(f"http://127.0.0.1:{cfg.metrics_port}/metrics", timeout=5) as resp:
                    scraped.append(resp.read().decode())

        s = run_point(cfg, tmp_path / "procs", "procs", on_progress=on_progress)
    assert s["requests"] > 20 and s["failures"]["total"] == 0
    assert s["ttft_s"]["p50"] == pytest.approx(0.03, abs=0.01)
    assert scraped, "client metrics were not served"
    text = scraped[0]
    count_lines = [ln for ln in text.splitlines() if ln.startswith(f"{mn.LOADGEN_TTFT_SECONDS}_count")]
    assert count_lines and 'run_id="procs"' in count_lines[0] and 'concurrency="6"' in count_lines[0]
    assert float(count_lines[0].split()[-1]) > 5
    users = [ln for ln in text.splitlines() if ln.startswith(mn.LOADGEN_USERS + "{")]
    assert users and float(users[0].split()[-1]) == 6  # 3 users in each of the 2 worker processes, summed


def test_sweep_resume_and_compare(tmp_path: Path) -> None:
    """Two runs against servers 2x apart in ITL: the report calls it; a resumed sweep reruns nothing."""
    runs = {}
    for name, itl in (("slow", "0.04"), ("fast", "0.02")):
        with fixture_server("--ttft", "0.02", "--itl", itl, "--flags", f"sparsemla_mma_decode={name}") as url:
            base = _config(url, 1, duration_s=3, warmup_s=1, workload="random:8:12")
            run_sweep(base, [2, 4], 1, tmp_path / name)
            before = (tmp_path / name / "c0002-r1" / "summary.json").stat().st_mtime
            run_sweep(base, [2, 4], 1, tmp_path / name)  # resume: everything is done already
            assert (tmp_path / name / "c0002-r1" / "summary.json").stat().st_mtime == before
        runs[name] = load_run(tmp_path / name)
    rows = compare_runs(runs["slow"], runs["fast"])
    itl = [r for r in rows if r.metric.key == "itl_p50"]
    assert len(itl) == 2 and all(r.significant and r.verdict.startswith("B better") for r in itl)
    tok = [r for r in rows if r.metric.key == "output_tok_per_s"]
    # ITL 2x apart; TTFT and the client's own time per request (more of it on a loaded 2-core CI machine) keep the
    # throughput ratio below 2: it is B / A of the cells and shows most of the 2x
    assert len(tok) == 2
    assert all(r.ratio.value == pytest.approx(r.b.value / r.a.value, rel=1e-9) for r in tok)
    assert all(1.4 <= r.ratio.value <= 2.2 for r in tok), [round(r.ratio.value, 3) for r in tok]
    goodput = [r for r in rows if r.metric.key == "goodput"]
    assert all(r.verdict in (NO_DIFFERENCE, "no CI (single sample)") for r in goodput)
    files = write_report(runs["slow"], runs["fast"], rows, tmp_path / "report")
    for key in ("md", "html", "throughput_vs_concurrency", "latency_vs_concurrency", "per_user_vs_throughput"):
        assert files[key].exists() and files[key].stat().st_size > 500
    assert "B better" in files["md"].read_text()
