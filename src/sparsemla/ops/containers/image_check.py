"""The image check: Dockerfile's ``sim`` target, run as a container as a user would run it.

Its HEALTHCHECK must pass (and fail against a container whose server is not running), ``/health``, ``/metrics`` and
``/server_info`` must answer on the published port, and a 20 s ``sparsemla loadtest`` at C=8 from the host (what
``make loadtest C=8`` runs) must finish requests with no failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sparsemla import flags, procs
from sparsemla.ops.containers.engine import ContainersError, Engine, Log

LABEL = "sparsemla.containers-test=image"  # on every container this check starts, for the cleanup
CONTAINER = "sparsemla-ct-image"
IDLE_CONTAINER = "sparsemla-ct-image-idle"  # the same image with its server not started: the healthcheck must fail
# Short requests, so that a 20 s run at C=8 finishes some at the simulator's calibrated step time (~0.3 s).
WORKLOAD = "random:256:16"


@dataclass(frozen=True)
class LoadResult:
    summary: dict[str, Any]
    output: str


def sparsemla_cli() -> list[str]:
    """The host venv's ``sparsemla`` (the one `make loadtest` calls)."""
    script = Path(sys.executable).parent / "sparsemla"
    return [str(script)] if script.exists() else [sys.executable, "-m", "sparsemla.cli"]


def run_loadtest(
    target: str, results_dir: Path, run_id: str, concurrency: int = 8, duration: str = "20s"
) -> LoadResult:
    """``sparsemla loadtest`` against ``target``; its summary. Raises unless it exits 0 with finished requests and
    no failure."""
    argv = [*sparsemla_cli(), "loadtest", "--concurrency", str(concurrency), "--duration", duration,
            "--target", target, "--workload", WORKLOAD, "--run-id", run_id, "--metrics-port", "0"]  # fmt: skip
    env = flags.child_env({"SPARSEMLA_RESULTS_DIR": str(results_dir)})
    done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300, env=env)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise ContainersError(f"`sparsemla loadtest` exited {done.returncode}:\n{output[-3000:]}")
    summary = json.loads((results_dir / "loadtest" / run_id / "summary.json").read_text())
    if summary["requests"] < 1 or summary["failure_rate"] != 0 or summary["output_tokens"] <= 0:
        raise ContainersError(
            f"load test against {target}: {summary['requests']} requests finished, failure rate "
            f"{summary['failure_rate']}, {summary['output_tokens']} output tokens (want > 0, 0, > 0)"
        )
    return LoadResult(summary, output)


def check_endpoints(base: str) -> dict[str, Any]:
    """``/health``, ``/metrics`` and ``/server_info`` of a simulator; its server info."""
    with httpx.Client(base_url=base, timeout=10) as client:
        health = client.get("/health")
        metrics = client.get("/metrics")
        info = client.get("/server_info")
    if health.status_code != 200:
        raise ContainersError(f"{base}/health answered {health.status_code}")
    missing = [m for m in ("sglang:num_running_reqs", "sparsemla_kernel_flags_info") if m not in metrics.text]
    if metrics.status_code != 200 or missing:
        raise ContainersError(f"{base}/metrics answered {metrics.status_code} without {missing}")
    body = info.json() if info.status_code == 200 else {}
    if not body.get("model_path") or "version" not in body:
        raise ContainersError(f"{base}/server_info answered {info.status_code}: {info.text[:300]}")
    return body


def healthcheck_argv(test: list[str]) -> list[str]:
    """The command line of a HEALTHCHECK test (``["CMD", ...]`` or ``["CMD-SHELL", "..."]``)."""
    if len(test) >= 2 and test[0] == "CMD":
        return test[1:]
    if len(test) == 2 and test[0] == "CMD-SHELL":
        return ["/bin/sh", "-c", test[1]]
    raise ContainersError(f"cannot read the HEALTHCHECK test {test}")


def check_image(engine: Engine, image: str, results_dir: Path, log: Log) -> LoadResult:
    """Run ``image`` as the simulator on a free loopback port and check it (see the module docstring)."""
    test = engine.healthcheck_of(image)
    if not any("/health" in part for part in test):
        raise ContainersError(f"{image} carries no HEALTHCHECK on /health (got {test})")
    port = procs.free_port()
    engine.remove(CONTAINER, IDLE_CONTAINER)
    try:
        engine.run("run", "-d", "--name", CONTAINER, "--label", LABEL, "-p", f"127.0.0.1:{port}:30000", image)
        engine.wait_healthy(CONTAINER, timeout=120, log=log)
        base = f"http://127.0.0.1:{port}"
        info = check_endpoints(base)
        log(f"{base}: /health 200, /metrics with sglang and sparsemla series, /server_info {info['version']!r}")
        result = run_loadtest(base, results_dir, "ct-image")
        summary = result.summary
        log(f"load test C=8 for 20 s: {summary['requests']} requests, {summary['output_tokens']:.0f} output tokens, "
            f"failure rate {summary['failure_rate']}")  # fmt: skip
        engine.run("run", "-d", "--name", IDLE_CONTAINER, "--label", LABEL, image, "sleep", "300")
        idle = engine.run("exec", IDLE_CONTAINER, *healthcheck_argv(test), check=False, timeout=60)
        if idle.returncode == 0:
            raise ContainersError("the HEALTHCHECK passes in a container whose server is not running")
        log(f"HEALTHCHECK in a container without the server: exit {idle.returncode} (unhealthy, as it must be)")
        return result
    finally:
        engine.remove(CONTAINER, IDLE_CONTAINER)
