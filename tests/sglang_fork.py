"""Fresh sglang processes in a second instead of ten: a parent that has imported ``sglang.srt.plugins`` and nothing
else forks one child per case, and the child runs the case's code as ``python -c`` would.

Why a fork and not ``subprocess.run([python, "-c", code])``: a case must run sglang's real ``load_plugins()`` in a
process where it never ran (it runs once per process and its hooks are process-wide), but importing
``sglang.srt.plugins`` alone costs ~8 CPU-seconds, which every case paid again. The parent imports exactly that and
nothing of this project (the import starts no thread, configures no logging and reads none of our flags), so a child is
the fresh process the case asked for, with that import already done: its environment is replaced by the case's before
the code runs; its stdout and stderr go to files; the exit status follows Python's rules (``SystemExit``'s code, a
message printed and 1, a traceback and 1), after the non-daemon threads ended and the ``atexit`` functions ran, as at
a normal interpreter exit.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PARENT = r"""
import atexit, json, os, sys, threading, traceback
import sglang.srt.plugins  # noqa: F401 - the import every case shares

def run_child(req):
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.environ.clear()
    os.environ.update(req["env"])
    status = 0
    try:
        exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    threading._shutdown()  # as at interpreter exit: wait for the non-daemon threads, then the atexit functions
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status & 0xFF)

print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            run_child(req)
        finally:
            os._exit(70)
    print(json.dumps({"pid": pid}), flush=True)
    _, wait_status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(wait_status)}), flush=True)
"""


class ForkingSglang:
    """``run(code, env)`` -> ``CompletedProcess`` (``args`` the code) as ``subprocess.run([python, "-c", code],
    env=env, capture_output=True, text=True)`` would give, from a forked child of one parent started with ``env``."""

    def __init__(self, env: dict[str, str], timeout_s: float = 300) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="sglang-fork-")
        self._log = open(Path(self._dir.name) / "parent.log", "w")  # noqa: SIM115 - closed in close()
        self._parent = subprocess.Popen(
            [sys.executable, "-c", _PARENT], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log
        )
        self._buf = b""
        ready = self._reply(timeout_s)
        if ready != "ready":
            log = (Path(self._dir.name) / "parent.log").read_text()[-3000:]
            self.close()
            raise RuntimeError(f"the sglang parent process did not start: {ready!r}\n{log}")
        self._cases = 0

    def _reply(self, timeout_s: float) -> str:
        """The parent's next line ('' when it ended or did not answer within ``timeout_s``). Read from the pipe's fd
        with a buffer of our own: a buffered reader could hold the next line where ``select`` does not see it."""
        deadline = time.monotonic() + timeout_s
        fd = self._parent.stdout.fileno()
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                return ""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def run(self, code: str, env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess:
        """Runs ``code`` in a new child with exactly ``env``; a child still running after ``timeout_s`` is killed and
        raises ``subprocess.TimeoutExpired``."""
        self._cases += 1
        out, err = (Path(self._dir.name) / f"{self._cases}.{name}" for name in ("out", "err"))
        req = {"code": code, "env": env, "stdout": str(out), "stderr": str(err)}
        self._parent.stdin.write((json.dumps(req) + "\n").encode())
        self._parent.stdin.flush()
        started = self._reply(30)
        if not started:
            raise RuntimeError(f"the sglang parent process did not fork (exit {self._parent.poll()})")
        reply = self._reply(timeout_s)
        if not reply:
            os.kill(json.loads(started)["pid"], signal.SIGKILL)
            self._reply(30)
            raise subprocess.TimeoutExpired(code, timeout_s)
        returncode = json.loads(reply)["returncode"]
        return subprocess.CompletedProcess(code, returncode, out.read_text(), err.read_text())

    def close(self) -> None:
        if self._parent.poll() is None:
            self._parent.stdin.close()
            try:
                self._parent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._parent.kill()
                self._parent.wait()
        self._log.close()
        self._parent.stdout.close()
        self._dir.cleanup()
