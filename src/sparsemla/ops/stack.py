"""`make up` / `make down` without Docker: the server (simulator or a local sglang), Prometheus and the kernel-share
exporter as plain background processes, PID files and logs under ``.run/`` (see :mod:`sparsemla.procs`).

Ports are the compose stack's: server 30000, Prometheus 9090, exporter 9400 (Locust's 8089/9646 belong to
``make loadtest``). Prometheus gets the compose configuration (``ops/prometheus/prometheus.yml``) rendered with
``127.0.0.1`` targets into ``.run/prometheus/prometheus.yml``, so both ways run the same jobs and the same rules.

``server="sim"`` starts ``sparsemla sim``. ``server="sglang"`` runs the command in ``SPARSEMLA_SGLANG_COMMAND`` (a shell
command line that must serve on the given port with ``--enable-metrics``; ``SGLANG_TORCH_PROFILER_DIR`` is set for it),
or, when that is empty, expects an sglang already listening on the port and only starts what surrounds it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparsemla import flags, procs
from sparsemla.console import UsageError
from sparsemla.ports import PORT_EXPORTER, PORT_LOCUST_METRICS, PORT_PROMETHEUS, PORT_SERVER

log = logging.getLogger(__name__)

PROMETHEUS_DIR = Path(__file__).resolve().parent / "prometheus"
# Stop order (reverse of start): nothing is left scraping or profiling a server that is gone.
STACK_PROCESSES = ("exporter", "prometheus", "server")
STATE_FILE = "stack.json"
SERVER_READY_TIMEOUT_S = 120.0  # the simulator starts in seconds; a real sglang is waited for much longer
SGLANG_READY_TIMEOUT_S = 3600.0


@dataclass
class DownReport:
    """What `down` did: names stopped, names it could not stop (with why), stale PID files it removed unsignalled."""

    stopped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"stopped: {', '.join(self.stopped)}"] if self.stopped else []
        out += [f"stale PID file of {name}: {why}" for name, why in self.stale.items()]
        out += [f"could not stop {name}: {why}" for name, why in self.failed.items()]
        return out or ["nothing was running"]


@dataclass
class StackUrls:
    """Base URLs of what `up` started or found; None for a part that is not running."""

    server: str
    prometheus: str | None
    exporter: str | None


def _sparsemla_argv(*args: str) -> list[str]:
    """``<venv>/bin/sparsemla ARGS`` (the interpreter's own console script), else ``python -m sparsemla.cli ARGS``."""
    script = Path(sys.executable).parent / "sparsemla"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "sparsemla.cli", *args]


def _start_until_ready(
    name: str,
    argv: list[str],
    env: dict[str, str],
    run_dir: Path,
    ready_url: str,
    timeout: float,
    what: str,
    stop_on_failure: bool = False,
    tied: bool = False,
) -> None:
    """Start ``name`` in the background and wait up to ``timeout`` s for ``ready_url`` to answer 200.

    When it does not, raise UsageError "``what`` did not come up" with its log's tail; ``stop_on_failure`` stops it
    first (for starts outside `up`, whose failure path stops everything anyway)."""
    proc = procs.start(name, argv, env=env, run_dir=run_dir, tied=tied)
    try:
        procs.wait_http(ready_url, timeout=timeout, pid=proc.pid)
    except (TimeoutError, RuntimeError) as exc:
        if stop_on_failure:
            result = procs.stop_report(name, run_dir=run_dir)
            if result.status == "failed":
                log.warning("could not stop %s: %s", name, result.detail)
        raise UsageError(f"{what} did not come up: {exc}\n{procs.log_tail(proc.log)}") from None


# -- Prometheus ------------------------------------------------------------------------------------------------------
def _debian_service_running() -> bool:
    return Path("/run/prometheus.pid").exists() or Path("/var/run/prometheus.pid").exists()


def stop_debian_service() -> None:
    """Stop (and disable, under systemd) the Debian ``prometheus`` service, which listens on :9090 once installed."""
    if Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        subprocess.run(["systemctl", "disable", "--now", "prometheus"], check=False, capture_output=True, timeout=60)
    elif shutil.which("service") and Path("/etc/init.d/prometheus").exists():
        subprocess.run(["service", "prometheus", "stop"], check=False, capture_output=True, timeout=60)


def ensure_prometheus_binary() -> str | None:
    """Path of a ``prometheus`` binary; installs Debian's package (``apt-get install -y prometheus``) when missing and
    apt is usable (root). Returns None when it cannot be had. After an install the Debian service, which may have
    auto-started on :9090, is stopped and disabled so that `make up` can use the port with its own configuration."""
    found = shutil.which("prometheus")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or not _is_root():
        return None
    env = flags.child_env({"DEBIAN_FRONTEND": "noninteractive"})
    result = subprocess.run([apt, "install", "-y", "-q", "prometheus"], env=env, capture_output=True, timeout=900)
    if result.returncode != 0:
        subprocess.run([apt, "update", "-q"], env=env, capture_output=True, timeout=600)
        result = subprocess.run([apt, "install", "-y", "-q", "prometheus"], env=env, capture_output=True, timeout=900)
    if result.returncode != 0:
        return None
    stop_debian_service()
    return shutil.which("prometheus")


def _is_root() -> bool:
    return os.geteuid() == 0


def render_local_config(
    *,
    server_port: int,
    exporter_port: int | None,
    prometheus_port: int,
    locust_metrics_port: int = PORT_LOCUST_METRICS,
    rules_dir: Path = PROMETHEUS_DIR,
) -> dict[str, Any]:
    """The compose Prometheus configuration with 127.0.0.1 targets, absolute rule paths, no DCGM job (no GPU agent
    runs beside plain processes), and no exporter job when the exporter is not started. The Locust job scrapes
    ``locust_metrics_port`` (what `sparsemla loadtest --metrics-port` serves; 9646 by default)."""
    import yaml

    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["rule_files"] = [str((rules_dir / name).resolve()) for name in config.get("rule_files", [])]
    targets = {
        "sglang": f"127.0.0.1:{server_port}",
        "kernel-share": f"127.0.0.1:{exporter_port}" if exporter_port else None,
        "locust": f"127.0.0.1:{locust_metrics_port}",
        "prometheus": f"127.0.0.1:{prometheus_port}",
    }
    jobs = []
    for job in config["scrape_configs"]:
        target = targets.get(job["job_name"])
        if target is None:
            continue
        job = {k: v for k, v in job.items() if not k.endswith("_sd_configs")}
        job["static_configs"] = [{"targets": [target]}]
        jobs.append(job)
    config["scrape_configs"] = jobs
    return config


def _write_local_config(run_dir: Path, **ports: Any) -> Path:
    import yaml

    directory = run_dir / "prometheus"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "prometheus.yml"
    header = "# Generated by `sparsemla up` from src/sparsemla/ops/prometheus/prometheus.yml; edit that file instead.\n"
    path.write_text(header + yaml.safe_dump(render_local_config(**ports), sort_keys=False))
    return path


# -- server ----------------------------------------------------------------------------------------------------------
def _start_server(state: dict[str, Any], sim_env: Mapping[str, str] | None, run_dir: Path) -> str:
    """Start (or find) the server described by ``state``; returns its URL once ``/health`` answers 200."""
    port = state["port"]
    url = f"http://127.0.0.1:{port}"
    trace_dir = str(Path(state["trace_dir"]).absolute())
    overrides: dict[str, str | None] = {"SGLANG_TORCH_PROFILER_DIR": trace_dir, **(sim_env or {})}
    if state["server"] == "sim":
        argv = _sparsemla_argv("sim", "--port", str(port))
        timeout = SERVER_READY_TIMEOUT_S
    else:
        command = flags.SPARSEMLA_SGLANG_COMMAND.get()
        if not command:
            if not procs.port_in_use(port):
                raise UsageError(
                    f"server=sglang: nothing listens on :{port} and SPARSEMLA_SGLANG_COMMAND is empty; start sglang "
                    f"with --port {port} --enable-metrics first, or set the command (see docs/deploy.md)"
                )
            procs.wait_http(f"{url}/health", timeout=60)
            state["external_server"] = True
            return url
        argv = ["/bin/sh", "-c", command]
        timeout = SGLANG_READY_TIMEOUT_S
    if procs.port_in_use(port):
        raise UsageError(f"port {port} is already in use; stop what runs there or pass another --port")
    env = flags.child_env(overrides)
    _start_until_ready(
        "server", argv, env, run_dir, f"{url}/health", timeout, "the server", stop_on_failure=True,
        tied=state.get("tied", False),
    )  # fmt: skip
    return url


# -- public API ------------------------------------------------------------------------------------------------------
def up(
    *,
    server: str = "sim",
    sim_env: Mapping[str, str] | None = None,
    prometheus: bool | None = None,
    exporter: bool = True,
    run_dir: Path = Path(".run"),
    port: int = PORT_SERVER,
    prometheus_port: int = PORT_PROMETHEUS,
    exporter_port: int = PORT_EXPORTER,
    locust_metrics_port: int = PORT_LOCUST_METRICS,
    tied: bool = False,
) -> StackUrls:
    """Start the server, Prometheus and the exporter as background processes; return their URLs.

    Prometheus scrapes the load generator's client metrics on ``locust_metrics_port`` (pass the same port to
    `sparsemla loadtest --metrics-port`; tests and the demo use a free one so that parallel runs do not collide).

    ``prometheus=None`` uses Prometheus when the binary exists or Debian's package can be installed, and runs without
    it otherwise (``StackUrls.prometheus`` is then None; the caller says so). ``tied``: the services die with this
    process, however it dies (the demo's; `up`'s outlive it until `down`), and so does a server restarted by
    :func:`restart_server` from this process. On any failure everything this call
    started is stopped again and UsageError says what went wrong (with the failing process's log tail)."""
    if server not in ("sim", "sglang"):
        raise UsageError(f"server must be 'sim' or 'sglang', got {server!r}")
    run_dir = Path(run_dir)
    already = {n: p for n, p in procs.running(run_dir).items() if n in STACK_PROCESSES}
    if already:
        raise UsageError(
            f"already running: {', '.join(f'{n} (pid {p})' for n, p in already.items())}; `make down` first"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {
        "server": server,
        "port": port,
        "prometheus_port": prometheus_port,
        "exporter_port": exporter_port,
        "locust_metrics_port": locust_metrics_port,
        "trace_dir": str((run_dir / "profiles").absolute()),
        "sim_env": dict(sim_env or {}),
        "external_server": False,
        "tied": tied,
    }
    try:
        server_url = _start_server(state, sim_env, run_dir)
        _write_state(run_dir, state)
        exporter_url = _start_exporter(state, server_url, run_dir) if exporter else None
        prometheus_url = None
        if prometheus is not False:
            prometheus_url = _start_prometheus(state, exporter, run_dir, required=prometheus is True)
    except BaseException:
        down(run_dir)
        raise
    urls = StackUrls(server=server_url, prometheus=prometheus_url, exporter=exporter_url)
    state["urls"] = asdict(urls)
    _write_state(run_dir, state)
    return urls


def _start_exporter(state: dict[str, Any], server_url: str, run_dir: Path) -> str:
    port = state["exporter_port"]
    if procs.port_in_use(port):
        raise UsageError(f"exporter port {port} is already in use")
    argv = _sparsemla_argv(
        "exporter",
        "--target",
        server_url,
        "--port",
        str(port),
        "--trace-dir",
        state["trace_dir"],
        "--host",
        "127.0.0.1",
    )
    url = f"http://127.0.0.1:{port}"
    _start_until_ready(
        "exporter", argv, flags.child_env(), run_dir, f"{url}/health", 60, "the exporter", tied=state.get("tied", False)
    )
    return url


def _start_prometheus(state: dict[str, Any], exporter: bool, run_dir: Path, required: bool) -> str | None:
    binary = ensure_prometheus_binary()
    if binary is None:
        if required:
            raise UsageError("prometheus is not installed and could not be installed (`apt-get install prometheus`)")
        return None
    port = state["prometheus_port"]
    if procs.port_in_use(port):
        if _debian_service_running():
            stop_debian_service()
            deadline = time.monotonic() + 15
            while procs.port_in_use(port) and time.monotonic() < deadline:
                time.sleep(0.2)
        if procs.port_in_use(port):
            raise UsageError(
                f"port {port} is in use (Debian's prometheus service? `service prometheus stop`), or pass another port"
            )
    config = _write_local_config(
        run_dir,
        server_port=state["port"],
        exporter_port=state["exporter_port"] if exporter else None,
        prometheus_port=port,
        locust_metrics_port=state.get("locust_metrics_port", PORT_LOCUST_METRICS),
    )
    argv = prometheus_argv(binary, config, (run_dir / "prometheus" / "data").absolute(), port)
    url = f"http://127.0.0.1:{port}"
    _start_until_ready(
        "prometheus",
        argv,
        flags.child_env(),
        run_dir,
        f"{url}/-/ready",
        60,
        "prometheus",
        tied=state.get("tied", False),
    )
    return url


def prometheus_argv(binary: str, config: Path, data: Path, port: int) -> list[str]:
    """Prometheus's command line for `up`: loopback only, and no ``--web.enable-lifecycle`` (its unauthenticated
    ``POST /-/quit`` would let any local process stop it; reload the configuration with SIGHUP instead)."""
    return [
        binary,
        f"--config.file={config.absolute()}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=7d",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def _write_state(run_dir: Path, state: dict[str, Any]) -> None:
    (run_dir / STATE_FILE).write_text(json.dumps(state, indent=1))


def read_state(run_dir: Path = Path(".run")) -> dict[str, Any] | None:
    """What the last `up` in ``run_dir`` started (server kind, ports, URLs), or None."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads((Path(run_dir) / STATE_FILE).read_text())
    return None


def down_report(run_dir: Path = Path(".run")) -> DownReport:
    """Stop every process `up` started in ``run_dir`` (exporter, Prometheus, server: each whole process group, also
    when its leader has died) and say what was stopped, what could not be, and which PID files were stale (naming no
    process of ours: nothing is signalled for those). The state file stays while something could not be stopped."""
    run_dir = Path(run_dir)
    report = DownReport()
    for name in STACK_PROCESSES:
        result = procs.stop_report(name, run_dir=run_dir)
        if result.status == "stopped":
            report.stopped.append(name)
        elif result.status == "failed":
            report.failed[name] = result.detail
        elif result.status == "stale":
            report.stale[name] = result.detail
    if not report.failed:
        (run_dir / STATE_FILE).unlink(missing_ok=True)
    return report


def down(run_dir: Path = Path(".run")) -> list[str]:
    """:func:`down_report`, returning the names stopped; what could not be stopped is logged as a warning."""
    report = down_report(run_dir)
    for name, why in {**report.stale, **report.failed}.items():
        log.warning("down: %s: %s", name, why)
    return report.stopped


def restart_server(sim_env: Mapping[str, str] | None, run_dir: Path = Path(".run")) -> str:
    """Restart the server of the running stack with new flag values (A/B flips); returns its URL once healthy.

    The exporter and Prometheus keep running (they follow the server by URL; the variant label changes)."""
    run_dir = Path(run_dir)
    state = read_state(run_dir)
    if state is None:
        raise UsageError(f"no stack recorded in {run_dir}; `make up` first")
    if state.get("external_server"):
        raise UsageError("the server was started outside `make up` (no SPARSEMLA_SGLANG_COMMAND); restart it yourself")
    try:
        procs.stop("server", run_dir=run_dir)
    except procs.StopError as exc:
        raise UsageError(f"cannot restart the server: {exc}") from None
    deadline = time.monotonic() + 30
    while procs.port_in_use(state["port"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    state["sim_env"] = dict(sim_env or {})
    url = _start_server(state, sim_env, run_dir)
    _write_state(run_dir, state)
    return url


def describe(urls: StackUrls) -> list[str]:
    """Lines for the console: one per part, with what to do when Prometheus is missing."""
    lines = [f"server      {urls.server}   (metrics: {urls.server}/metrics)"]
    lines.append(
        f"exporter    {urls.exporter}   (POST /snapshot, `make profile`)" if urls.exporter else "exporter    off"
    )
    lines.append(
        f"prometheus  {urls.prometheus}"
        if urls.prometheus
        else "prometheus  not running: no binary, and Debian's package could not be installed (apt-get install)"
    )
    return lines
