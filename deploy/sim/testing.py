"""Start a simulator subprocess on a free port for tests and scripts (flags through ``flags.child_env``)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sparsemla import flags
from sparsemla.procs import free_port, wait_http


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
    argv = [sys.executable, "-c", "from sparsemla.deploy.sim.cli import app; app()", "--port", str(port), *args]
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
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
