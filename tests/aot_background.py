"""The ahead-of-time compile behind tests/test_aot.py, as two background child processes (this machine has two
cores): every case of ``sparsemla.kernels.aot`` for three targets each. conftest.py starts them as soon as collection
has chosen test_aot.py, at a lower CPU priority, and moves test_aot.py to the end of the run, so the ~9 minutes of
compiling overlap the rest of the suite (which keeps one core busy) instead of adding to it; test_aot.py waits for
them (or starts them itself when run alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sparsemla import flags

GROUPS = (("sm_80", "sm_86", "sm_89"), ("sm_90", "sm_100", "sm_120"))
# The children's niceness (absolute): below the test run's own priority, so its end-to-end tests keep their timing.
# Under scripts/test-lanes.sh the pytest process that starts them is at 10 already, and they stay at 10, level with it
# (one level lower, 19, starved them behind both lanes: test_aot.py's wait ran past its timeout).
NICE = 10
TIMEOUT_S = 1500


@dataclass
class AotRun:
    folder: Path
    procs: list[subprocess.Popen]

    def wait(self) -> dict:
        """Records of every target (``{"triton", "records", "runs"}``), once both children have ended."""
        runs = []
        for i, proc in enumerate(self.procs):
            try:
                proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log = (self.folder / f"{i}.log").read_text()
            runs.append(subprocess.CompletedProcess(proc.args, proc.returncode, "", log))
        outs = [self.folder / f"{i}.json" for i in range(len(self.procs))]
        docs = [json.loads(out.read_text()) for out in outs if out.exists()]
        assert len(docs) == len(self.procs), "\n".join(r.stderr[-2000:] for r in runs)
        return {"triton": docs[0]["triton"], "records": [r for doc in docs for r in doc["records"]], "runs": runs}


def start(folder: Path) -> AotRun:
    """Starts both children (output in ``folder``) and returns at once."""
    folder.mkdir(parents=True, exist_ok=True)
    env = flags.child_env({"TRITON_INTERPRET": None})  # the interpreter never compiles
    procs = []
    for i, targets in enumerate(GROUPS):
        cmd = [sys.executable, "-m", "sparsemla.kernels.aot", "--json", str(folder / f"{i}.json")]
        for arch in targets:
            cmd += ["--arch", arch]
        with open(folder / f"{i}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          preexec_fn=lambda: os.nice(max(0, NICE - os.nice(0)))))  # fmt: skip
    return AotRun(folder, procs)
