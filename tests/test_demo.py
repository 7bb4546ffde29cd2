"""A short `sparsemla demo` run (the CI version of `make demo`): report files, A/B table, calibrated ratio, cleanup."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparsemla import flags, procs

pytestmark = pytest.mark.slow


def test_short_demo_matches_the_calibrated_ratio(tmp_path: Path) -> None:
    results, run_dir = tmp_path / "results", tmp_path / "run"
    argv = [sys.executable, "-c", "from sparsemla.ops.demo import app; app()", "--point-seconds", "4",
            "--concurrency", "1 8", "--no-prometheus", "--port", "0", "--run-dir", str(run_dir)]  # fmt: skip
    env = flags.child_env({"SPARSEMLA_RESULTS_DIR": str(results), "SPARSEMLA_MMA_DECODE": None})
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    demo = results / "demo"
    for name in ("report.html", "report.md", "compare.json", "throughput_vs_concurrency.png",
                 "latency_vs_concurrency.png", "per_user_vs_throughput.png"):  # fmt: skip
        assert (demo / name).stat().st_size > 500, name
    info = json.loads((demo / "demo.json").read_text())
    assert info["variant_b"] == "mma_decode" and [r["concurrency"] for r in info["ratios"]] == [1, 8]
    for ratio in info["ratios"]:
        assert abs(ratio["deviation"]) < 0.10, ratio  # issue 6: A/B tok/s ratio within 10 % of the calibration
    assert "B better" in out.stdout and "Output tok/s" in out.stdout
    summaries = [json.loads(p.read_text()) for p in demo.rglob("summary.json")]
    assert len(summaries) == 4 and all(s["failures"]["total"] == 0 for s in summaries)
    assert {s["server_flags"]["sparsemla_mma_decode"] for s in summaries} == {"on", "off"}
    assert procs.running(run_dir) == {}  # everything the demo started is stopped


@pytest.mark.parametrize("prometheus", [False, True], ids=["sim-only", "with-prometheus"])
def test_sigkill_of_the_demo_takes_its_services_down(tmp_path: Path, prometheus: bool) -> None:
    """SIGKILL runs no handler: the demo's simulator (and Prometheus) must still not outlive it."""
    import shutil
    import signal
    import time

    if prometheus and shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (make setup installs it)")
    results, run_dir = tmp_path / "results", tmp_path / "run"
    argv = [sys.executable, "-c", "from sparsemla.ops.demo import app; app()", "--point-seconds", "30",
            "--concurrency", "1", "--port", "0", "--run-dir", str(run_dir),
            "--prometheus" if prometheus else "--no-prometheus"]  # fmt: skip
    env = flags.child_env({"SPARSEMLA_RESULTS_DIR": str(results), "SPARSEMLA_MMA_DECODE": None})
    demo = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        want = {"server", "prometheus"} if prometheus else {"server"}
        deadline = time.monotonic() + 60
        while not want <= set(procs.running(run_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        services = procs.running(run_dir)
        assert want <= set(services), services
        time.sleep(1.0)  # into the first sweep point
        demo.send_signal(signal.SIGKILL)
        demo.wait(timeout=10)
        deadline = time.monotonic() + 20
        while any(procs.is_alive(p) for p in services.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [n for n, p in services.items() if procs.is_alive(p)], "services outlived the demo"
    finally:
        if demo.poll() is None:
            demo.kill()
        for pid in procs.running(run_dir).values():  # never leave them behind, even when the test fails
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
