"""Background processes for `make up`, `make demo` and end-to-end tests: start with a PID file, wait, stop.

Every process is started in its own session and process group (so a stop kills its children too, even when the
leader itself has died), logs to ``<run_dir>/<name>.log`` and is recorded in ``<run_dir>/<name>.pid`` with what
identifies it: its start time (``/proc/<pid>/stat`` field 22), the boot id and the command line. :func:`stop` signals
only processes of that recorded session (a stale PID file naming an unrelated process is never signalled): SIGTERM to
the group, wait, then SIGKILL; it reports what it could not stop.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class _Stat:
    state: str
    pgid: int
    sid: int
    start_time: int  # clock ticks since boot


def _stat(pid: int) -> _Stat | None:
    """Fields of ``/proc/<pid>/stat`` (None when there is no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name in (...) may hold spaces and parentheses
    return _Stat(state=fields[0], pgid=int(fields[2]), sid=int(fields[3]), start_time=int(fields[19]))


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    return ""


@dataclass(frozen=True)
class PidRecord:
    """What a PID file records: the session leader's PID (= its process group and session id), its start time and the
    boot it ran in (together unique: a reused PID has another start time), and the command that was started."""

    pid: int
    start_time: int
    boot_id: str
    argv: tuple[str, ...]

    def same_leader(self) -> bool | None:
        """True when ``pid`` is still the recorded process, False when the PID now names another one, None when no
        process has it."""
        stat = _stat(self.pid)
        if stat is None:
            return None
        return stat.start_time == self.start_time and _boot_id() == self.boot_id

    def members(self) -> list[int]:
        """Live (not zombie) processes of the recorded session or process group, the leader included if it lives.

        Empty when the PID now names another process: Linux does not hand out a PID that is still some process's group
        or session id, so while one of ours lives the number cannot name a stranger; once it does, none of ours is
        left. A process older than the leader is never counted."""
        if self.same_leader() is False or _boot_id() != self.boot_id:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            stat = _stat(int(entry.name))
            if stat is None or stat.state in ("Z", "X") or stat.start_time < self.start_time:
                continue
            if stat.pgid == self.pid or stat.sid == self.pid:
                found.append(int(entry.name))
        return sorted(found)


class StaleRecord(ValueError):
    """A PID file that does not identify a process of ours (an older format, or unreadable)."""


def read_record(name: str, run_dir: Path = DEFAULT_RUN_DIR) -> PidRecord | None:
    """The PID file of ``name``; None when there is none. StaleRecord when it cannot identify a process (a plain PID
    from an older sparsemla, or garbage): such a PID is never signalled."""
    path = _pid_file(name, run_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StaleRecord(f"{path}: unreadable ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
        return PidRecord(int(data["pid"]), int(data["start_time"]), str(data["boot_id"]), tuple(data["argv"]))
    except (ValueError, TypeError, KeyError):
        raise StaleRecord(f"{path}: no process identity recorded ({text.strip()[:60]!r})") from None


def is_alive(pid: int) -> bool:
    """True when ``pid`` names a running (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(pid)
    return stat is None or stat.state != "Z"  # no /proc entry (not Linux): os.kill's answer stands


def read_pid(name: str, run_dir: Path = DEFAULT_RUN_DIR) -> int | None:
    """The recorded PID (session and group id) of ``name`` while a process of it runs (the leader, or children of a
    leader that died), else None; None too for a PID file that does not identify its process (see read_record)."""
    try:
        record = read_record(name, run_dir)
    except StaleRecord:
        return None
    return record.pid if record is not None and record.members() else None


def start(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    run_dir: Path = DEFAULT_RUN_DIR,
    cwd: Path | None = None,
    tied: bool = False,
) -> Proc:
    """Start ``argv`` in the background in a new session, logging to ``<run_dir>/<name>.log``.

    ``tied``: the process gets SIGTERM when this one dies, however it dies (through :mod:`sparsemla.tether`);
    otherwise it outlives this process until :func:`stop`.

    Raises RuntimeError when a process of that name is already running (stop it first)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    existing = read_pid(name, run_dir)
    if existing is not None:
        raise RuntimeError(f"{name} is already running (pid {existing}); stop it first")
    log = run_dir / f"{name}.log"
    if tied:
        argv = [sys.executable, "-m", "sparsemla.tether", str(os.getpid()), "--", *argv]
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
    stat = _stat(proc.pid)  # set at fork, so right even before the exec; the child cannot have exited unreaped
    record = {"pid": proc.pid, "start_time": stat.start_time if stat else -1, "boot_id": _boot_id(), "argv": list(argv)}
    tmp = _pid_file(name, run_dir).with_suffix(".pid.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(_pid_file(name, run_dir))
    return Proc(name, proc.pid, log)


class StopError(RuntimeError):
    """Processes of a recorded session survived SIGKILL (or may not be signalled); the message lists them."""


@dataclass(frozen=True)
class StopResult:
    """What :func:`stop_report` did: ``stopped`` (processes of it ran and are gone), ``not running``, ``stale`` (the
    PID file named no process of ours: nothing was signalled) or ``failed`` (some survive; ``detail`` says which)."""

    name: str
    status: str
    detail: str = ""


def _signal(record: PidRecord, members: list[int], sig: signal.Signals) -> None:
    """``sig`` to the recorded group (only called while a member of it lives, so the id is ours) and to members that
    left the group but not the session."""
    groups = {m: stat.pgid for m in members if (stat := _stat(m)) is not None}
    if record.pid in groups.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, sig)
    for pid, pgid in groups.items():
        if pgid != record.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _wait_gone(record: PidRecord, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(record.pid, os.WNOHANG)  # reap the leader when it is our own child
        left = record.members()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def stop_report(name: str, *, run_dir: Path = DEFAULT_RUN_DIR, timeout: float = 15.0) -> StopResult:
    """Stop every process of ``name``'s recorded session: SIGTERM to the group, SIGKILL after ``timeout`` s.

    Only processes the PID file identifies are signalled (start time and boot id of the leader; see PidRecord): a
    PID file whose number now names another process, or that records no identity, is removed without signalling
    anything. The PID file stays when something survives, so that a later stop can retry."""
    path = _pid_file(name, run_dir)
    try:
        record = read_record(name, run_dir)
    except StaleRecord as exc:
        path.unlink(missing_ok=True)
        return StopResult(name, "stale", f"{exc}; nothing signalled (stop the process yourself if it is ours)")
    if record is None:
        return StopResult(name, "not running")
    members = record.members()
    if not members:
        path.unlink(missing_ok=True)
        if record.same_leader() is False:
            other = _cmdline(record.pid) or "?"
            return StopResult(name, "stale", f"pid {record.pid} is now another process ({other[:80]}); not signalled")
        return StopResult(name, "not running")
    _signal(record, members, signal.SIGTERM)
    left = _wait_gone(record, timeout)
    if left:
        _signal(record, left, signal.SIGKILL)
        left = _wait_gone(record, 5.0)
    if left:
        survivors = ", ".join(f"{pid} ({_cmdline(pid)[:60] or '?'})" for pid in left)
        return StopResult(name, "failed", f"still running after SIGKILL: {survivors}")
    path.unlink(missing_ok=True)
    return StopResult(name, "stopped")


def stop(name: str, *, run_dir: Path = DEFAULT_RUN_DIR, timeout: float = 15.0) -> bool:
    """Stop ``name`` (see :func:`stop_report`). True if processes of it ran and are gone, False if none ran (or the
    PID file was stale); StopError if some survive."""
    result = stop_report(name, run_dir=run_dir, timeout=timeout)
    if result.status == "failed":
        raise StopError(f"{name}: {result.detail}")
    return result.status == "stopped"


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


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _libc() -> Any | None:
    """The C library through ctypes, looked up once (the lookup may run ``ldconfig``: not in a fork hook)."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def can_die_with_parent() -> bool:
    """True where :func:`die_with_parent` can arm (Linux with a C library); call it before forking, so the lookup is
    done in the parent and a forked child's call costs one system call."""
    return _libc() is not None and hasattr(_libc(), "prctl")


def die_with_parent(expected_parent: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``).

    Call it in the child (e.g. at its start-up); ``expected_parent`` is the PID of the process that started it. When
    that parent is already gone (it died before the call: this process was re-parented), this process exits at once,
    so no window is left in which an orphan keeps running. The setting is cleared in forked children, so each forked
    worker calls this itself. Returns False where prctl is not available (not Linux): then nothing is armed."""
    if not can_die_with_parent():
        return False
    armed = _libc().prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    if os.getppid() != expected_parent:
        os._exit(128 + int(sig))  # the parent died before the setting took effect
    return armed


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that it unwinds like Ctrl-C (children stopped, results kept)."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) in the main thread, so every
    ``except BaseException`` / ``finally`` that stops children on Ctrl-C also runs on SIGTERM. The previous handler
    comes back at the end. Outside the main thread (no signal handlers there) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
