"""The compose check: compose.yaml's ``sim`` profile brought up as a user would, then driven and read back.

Every service must be healthy (its own compose healthcheck; the two Locust workers running and connected), every
Prometheus target up (``up == 1``), Locust must send load through the master's HTTP API (the endpoint its web UI
posts to, no browser) with no failure, the exporter must take a kernel-share snapshot, and every dashboard query —
PromQL extracted from the committed dashboards by :mod:`sparsemla.dashboards.grafana_eval`, as in
tests/test_dashboards_e2e.py — must return data from the compose Prometheus, except the DCGM panels (``[profile
gpu]``: no GPU). Grafana itself only runs with registry images (``--registry``): it has no stand-in (Debian does not
package it), so with the stand-ins nothing checks the Grafana container and its Grafana-side annotations.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sparsemla import procs
from sparsemla import variant as kernel_variant
from sparsemla.dashboards import build, grafana_eval
from sparsemla.dashboards.panels import iter_panels
from sparsemla.ops.containers.engine import ContainersError, Engine, Log

PROJECT = "sparsemla-ct"
PROJECT_LABEL = f"label=com.docker.compose.project={PROJECT}"  # set by docker compose and podman-compose alike
NETWORK = "sparsemla"  # compose.yaml names its network: one stack of the file at a time per engine
SERVICES = ("sim", "prometheus", "kernel-share", "locust", "locust-worker")
WORKERS = 2
JOBS = {"sglang", "kernel-share", "locust", "prometheus"}  # dcgm has no target without the gpu profile
USERS = 8
LOAD_S = 20.0
# Variables compose reads that a developer's shell may export: removed, so that the env file decides.
SHELL_VARS = ("COMPOSE_FILE", "COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME", "SPARSEMLA_VERSION")


@dataclass
class ComposeStack:
    """One compose project of compose.yaml's sim profile, on free loopback ports, with its env file in ``work``."""

    engine: Engine
    ops_version: str  # compose's ops image is sparsemla-ops:${SPARSEMLA_VERSION}
    prometheus_image: str | None  # the stand-in (compose.standins.yaml); None: compose.yaml's own image
    work: Path
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ports = {name: procs.free_port() for name in ("server", "prometheus", "exporter", "locust", "grafana")}
        self.work.mkdir(parents=True, exist_ok=True)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.env().items()))

    @property
    def env_file(self) -> Path:
        return self.work / "compose.env"

    @property
    def services(self) -> tuple[str, ...]:
        return SERVICES if self.prometheus_image else (*SERVICES, "grafana-sim")

    def files(self) -> list[Path]:
        repo = self.engine.repo
        files = [repo / "compose.yaml", repo / "compose.localhost.yaml"]
        if self.engine.podman:
            files.append(repo / "compose.podman.yaml")
        if self.prometheus_image:
            files.append(repo / "compose.standins.yaml")
        return files

    def env(self) -> dict[str, str]:
        env = {
            "SPARSEMLA_VERSION": self.ops_version,
            # compose interpolates the whole file, Grafana's required password included
            "GRAFANA_ADMIN_PASSWORD": "sparsemla-containers-test",
            "GRAFANA_PORT": str(self.ports["grafana"]),
            "SERVER_PORT": str(self.ports["server"]),
            "PROMETHEUS_PORT": str(self.ports["prometheus"]),
            "EXPORTER_PORT": str(self.ports["exporter"]),
            "LOCUST_WEB_PORT": str(self.ports["locust"]),
            "LOCUST_WORKLOAD": "random:256:16",  # requests that finish within the run
            "LOCUST_VARIANT": kernel_variant.BASELINE,  # the simulator's, every kernel flag being off
            "LOCUST_WORKERS": str(WORKERS),  # compose.podman.yaml: podman-compose's `down` must know them all
            "KERNEL_SHARE_STEPS": "5",
            "KERNEL_SHARE_INTERVAL": "0",
        }
        if self.prometheus_image:
            env["SPARSEMLA_PROMETHEUS_IMAGE"] = self.prometheus_image
        return env

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["-p", PROJECT, "--env-file", str(self.env_file)]
        for path in self.files():
            argv += ["-f", str(path)]
        unset = (*SHELL_VARS, *self.env())
        return self.engine.compose([*argv, "--profile", "sim", *args], unset=unset, timeout=timeout, check=check)

    def containers(self, service: str | None = None) -> list[str]:
        extra = [f"label=com.docker.compose.service={service}"] if service else []
        return self.engine.containers(PROJECT_LABEL, *extra)

    def up(self, log: Log) -> None:
        foreign = sorted(set(self.engine.containers(f"network={NETWORK}")) - set(self.containers()))
        if foreign:
            raise ContainersError(
                f"another stack uses the compose network {NETWORK!r} ({', '.join(foreign)}): stop it first "
                "(`docker compose down` / `podman-compose down` in its folder)"
            )
        self.compose("down", "-v", "-t", "5", timeout=300)  # what a killed earlier run may have left
        log(f"compose up: {' '.join(self.services)} ({' + '.join(p.name for p in self.files())})")
        self.compose("up", "-d", "--no-build", "--scale", f"locust-worker={WORKERS}", *self.services)

    def down(self) -> str:
        """Stop and remove the project (containers, volumes, network), forcing out any container compose left; what
        went wrong ("" when nothing did). Never raises: it runs in ``finally``, after whatever failed first."""
        problems = []
        try:
            done = self.compose("down", "-v", "-t", "5", timeout=300, check=False)
            if done.returncode != 0:
                problems.append(f"compose down exited {done.returncode}: {done.stderr.strip()[-1000:]}")
            left = self.containers()
            if left:
                self.engine.remove(*left)
                problems.append(f"compose down left {left} (removed with rm -f)")
            volumes = self.engine.run("volume", "ls", "--format", "{{.Name}}", timeout=60).stdout.split()
            if ours := [v for v in volumes if v.startswith(f"{PROJECT}_")]:
                self.engine.run("volume", "rm", "-f", *ours, check=False, timeout=120)
                problems.append(f"compose down left the volumes {ours} (removed)")
            if NETWORK in self.engine.run("network", "ls", "--format", "{{.Name}}", timeout=60).stdout.split():
                self.engine.run("network", "rm", NETWORK, check=False, timeout=120)
                problems.append(f"compose down left the network {NETWORK} (removed)")
        except ContainersError as exc:
            problems.append(str(exc))
        return "; ".join(problems)


def wait_services(stack: ComposeStack, log: Log) -> None:
    """Every service healthy by its compose healthcheck; the workers (healthcheck disabled) running."""
    for service in stack.services:
        names = stack.containers(service)
        want = WORKERS if service == "locust-worker" else 1
        if len(names) != want:
            raise ContainersError(f"service {service}: {len(names)} containers ({names}), want {want}")
        for name in names:
            if service == "locust-worker":
                if not stack.engine.running(name):
                    raise ContainersError(f"{name} is not running")
                log(f"{name}: running (no healthcheck: the master counts its workers)")
            else:
                stack.engine.wait_healthy(name, timeout=180, log=log)


def wait_targets(prometheus: str, log: Log, timeout: float = 90.0) -> list[dict[str, Any]]:
    """Prometheus' active targets once every one is up and every job has one; then ``up`` must be 1 for each."""
    deadline = time.monotonic() + timeout
    targets: list[dict[str, Any]] = []
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            targets = client.get(f"{prometheus}/api/v1/targets").json()["data"]["activeTargets"]
            jobs = {t["labels"]["job"] for t in targets}
            if JOBS <= jobs and all(t["health"] == "up" for t in targets):
                break
            time.sleep(2)
        else:
            state = [(t["labels"]["job"], t["health"], t.get("lastError")) for t in targets]
            raise ContainersError(f"Prometheus targets not all up after {timeout:.0f} s: {state}")
        up = client.post(f"{prometheus}/api/v1/query", data={"query": "up"}).json()["data"]["result"]
    values = {(s["metric"]["job"], s["metric"]["instance"]): s["value"][1] for s in up}
    if len(values) != len(targets) or set(values.values()) != {"1"}:
        raise ContainersError(f"`up` is not 1 for every target: {values}")
    for target in targets:
        log(f"Prometheus target {target['labels']['job']} ({target['scrapeUrl']}): up")
    return targets


def locust_stats(client: httpx.Client, base: str) -> dict[str, Any]:
    return client.get(f"{base}/stats/requests").json()


def drive_load(stack: ComposeStack, log: Log) -> dict[str, Any]:
    """Start USERS users on the Locust master (spread over its workers), take a kernel-share snapshot through the
    exporter while they generate, stop after LOAD_S; the snapshot. Raises on a failed request or snapshot."""
    base = stack.url("locust")
    with httpx.Client(timeout=30) as client:
        deadline = time.monotonic() + 60
        while locust_stats(client, base).get("worker_count") != WORKERS:
            if time.monotonic() > deadline:
                raise ContainersError(f"the Locust master has not {WORKERS} workers: {locust_stats(client, base)}")
            time.sleep(1)
        started = time.monotonic()
        swarm = client.post(f"{base}/swarm", data={"user_count": USERS, "spawn_rate": USERS,
                                                    "host": "http://server:30000"}).json()  # fmt: skip
        if not swarm.get("success"):
            raise ContainersError(f"Locust refused the swarm: {swarm}")
        log(f"Locust: {USERS} users on {WORKERS} workers against http://server:30000")
        time.sleep(6)  # the profiler counts forward steps: snapshot while the server is generating
        snapshot = client.post(f"{stack.url('exporter')}/snapshot", timeout=240).json()
        if snapshot.get("outcome") != "ok" or not snapshot.get("summary"):
            raise ContainersError(f"kernel-share snapshot through the exporter: {snapshot}")
        log(f"kernel-share snapshot through the exporter: {snapshot['outcome']}, {len(snapshot['summary'])} entries")
        time.sleep(max(0.0, LOAD_S - (time.monotonic() - started)))
        stats = locust_stats(client, base)
        client.post(f"{base}/stop")
    total = next(s for s in stats["stats"] if s["name"] == "Aggregated")
    if total["num_requests"] < 1 or total["num_failures"] or stats.get("errors"):
        raise ContainersError(f"Locust: {total['num_requests']} requests, {total['num_failures']} failures, "
                              f"errors {stats.get('errors')}")  # fmt: skip
    log(f"Locust: {total['num_requests']} requests, 0 failures, {stats.get('user_count')} users")
    return snapshot


@dataclass(frozen=True)
class DashboardResult:
    checked: int  # panel queries run (repeated panels once per value)
    empty: dict[str, str]  # panel title -> its profile ("gpu" for DCGM; "" for always-fed panels)


def dashboard_queries(prometheus: str, start: float, end: float) -> DashboardResult:
    """Every committed dashboard's panels and Prometheus annotations over [start, end], as Grafana would run them."""
    api = grafana_eval.PrometheusAPI(prometheus)
    checked, empty = 0, {}
    try:
        for path in sorted(build.GENERATED_DIR.glob("*.json")):
            dashboard = build.load(path.name)
            resolved = grafana_eval.resolve_variables(dashboard, api, start, end)
            for ref in iter_panels(dashboard):
                for panel_ref, extra in grafana_eval.expand_repeats(ref, resolved):
                    results = grafana_eval.panel_series(panel_ref, api, {**resolved.text, **extra}, start, end)
                    checked += 1
                    if any(not grafana_eval.has_data(r) for r in results):
                        empty[f"{path.stem}: {panel_ref.title}"] = ref.profile or ""
            # Annotations on the Prometheus data source (the Grafana-side ones need Grafana), at every scrape.
            for annotation in dashboard["annotations"]["list"]:
                if annotation.get("expr"):
                    expr = grafana_eval.promql.expand(annotation["expr"], resolved.text)
                    checked += 1
                    if not api.query_range(expr, start - 30, end, grafana_eval.SCRAPE_INTERVAL_S):
                        empty[f"{path.stem}: annotation {annotation['name']}"] = ""
    finally:
        api.close()
    return DashboardResult(checked, empty)


def check_compose(stack: ComposeStack, log: Log) -> DashboardResult:
    """Bring the stack up, check it (see the module docstring), and always bring it down."""
    passed = False
    try:
        stack.up(log)
        wait_services(stack, log)
        wait_targets(stack.url("prometheus"), log)
        start = time.time()
        drive_load(stack, log)
        time.sleep(grafana_eval.SCRAPE_INTERVAL_S + 2)  # one more scrape after the last request
        result = dashboard_queries(stack.url("prometheus"), start, time.time())
        missing = {title for title, profile in result.empty.items() if profile != "gpu"}
        if missing:
            raise ContainersError(f"dashboard queries without data from the compose Prometheus: {sorted(missing)}")
        gpu = sorted(title for title, profile in result.empty.items() if profile == "gpu")
        log(f"dashboards: {result.checked - len(gpu)} of {result.checked} queries with data; empty only the DCGM "
            f"panels (no GPU here): {gpu}")  # fmt: skip
        passed = True
        return result
    finally:
        problem = stack.down()
        log(f"compose down -v: {problem or 'every container, volume and the network removed'}")
        if passed and problem:
            raise ContainersError(problem)
