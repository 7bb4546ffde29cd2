"""Background processes for `make up`, `make demo` and end-to-end tests: start with a PID file, wait, stop.

Every process is started in its own session (so a stop kills its children too), logs to ``<run_dir>/<name>.log`` and is
recorded in ``<run_dir>/<name>.pid``. :func:`stop` sends SIGTERM, waits, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RUN_DIR = Path(".run")


@dataclass(frozen=True)
class Proc:
    """A started background process."""

    name: str
    pid: int
    log: Path


def free_port(host: str = "127.0.0.1") -> int:
    """An unused TCP port on ``host`` (for tests that start servers side by side)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def _pid_file(name: str, run_dir: Path) -> Path:
    return run_dir / f"{name}.pid"


def is_alive(pid: int) -> bool:
    """True when ``pid`` names a running (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def read_pid(name: str, run_dir: Path = DEFAULT_RUN_DIR) -> int | None:
    """The recorded PID of ``name`` if that process still runs, else None."""
    path = _pid_file(name, run_dir)
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if is_alive(pid) else None


def start(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    run_dir: Path = DEFAULT_RUN_DIR,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` in the background in a new session, logging to ``<run_dir>/<name>.log``.

    Raises RuntimeError when a process of that name is already running (stop it first)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    existing = read_pid(name, run_dir)
    if existing is not None:
        raise RuntimeError(f"{name} is already running (pid {existing}); stop it first")
    log = run_dir / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _pid_file(name, run_dir).write_text(f"{proc.pid}\n")
    return Proc(name, proc.pid, log)


def stop(name: str, *, run_dir: Path = DEFAULT_RUN_DIR, timeout: float = 15.0) -> bool:
    """Stop ``name`` (SIGTERM to its process group, then SIGKILL after ``timeout``). True if it was running."""
    path = _pid_file(name, run_dir)
    pid = read_pid(name, run_dir)
    if pid is None:
        path.unlink(missing_ok=True)
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and is_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if is_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    path.unlink(missing_ok=True)
    return True


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file for an error message ("(no log)" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_child(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a child this process started with ``subprocess.Popen``: SIGTERM, wait up to ``timeout`` s, then SIGKILL.

    Always reaps it; nothing happens when it has already exited. (Only the child itself: use :func:`start` and
    :func:`stop` for process groups with PID files.)"""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def running(run_dir: Path = DEFAULT_RUN_DIR) -> dict[str, int]:
    """Names and PIDs of the processes recorded in ``run_dir`` that still run."""
    found = {}
    for path in sorted(run_dir.glob("*.pid")) if run_dir.exists() else []:
        pid = read_pid(path.stem, run_dir)
        if pid is not None:
            found[path.stem] = pid
    return found


def wait_http(url: str, timeout: float = 30.0, pid: int | None = None) -> None:
    """Wait until ``url`` answers 200; raise TimeoutError (or RuntimeError if ``pid`` died meanwhile)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if pid is not None and not is_alive(pid):
            raise RuntimeError(f"process {pid} exited before {url} became ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s ({last})")
