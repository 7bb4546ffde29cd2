"""The parts of the container checks that need no engine (`make test` runs these; `make test-containers` the rest):
cache keys of the stand-ins, the files and settings each engine gets, and the errors a missing prerequisite gives."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

# Needs the ops extras (the compose check reads the dashboards): the GPU machine installs the runtime only.
pytest.importorskip("grafana_foundation_sdk")
from sparsemla import flags  # noqa: E402
from sparsemla.ops.containers import compose_check, engine, image_check, standins  # noqa: E402
from sparsemla.ops.containers.engine import ContainersError, Engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _copy_recipes(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy", repo / "deploy")
    for name in ("Dockerfile", "compose.yaml"):
        shutil.copy(ROOT / name, repo / name)
    return repo


def test_standin_tags_follow_their_containerfile_and_base(tmp_path: Path) -> None:
    repo = _copy_recipes(tmp_path)
    base = standins.BaseRecipe().tag
    before = {name: standins.standin_tag(repo, name, base) for name in standins.STANDINS}
    assert before == {name: standins.standin_tag(ROOT, name, base) for name in standins.STANDINS}  # stable
    path = standins.containerfile(repo, "python")
    path.write_text(path.read_text() + "# changed\n")
    assert standins.standin_tag(repo, "python", base) != before["python"]
    assert standins.standin_tag(repo, "prometheus", base) == before["prometheus"]
    other_base = standins.BaseRecipe(mirror="http://mirror.example/debian").tag
    assert other_base != base
    assert all(standins.standin_tag(repo, n, other_base) != before[n] for n in standins.STANDINS)


def test_each_standin_names_the_pinned_image_it_replaces() -> None:
    upstream = standins.upstream_images(ROOT)
    assert upstream == {"python": "python:3.11.13-slim-bookworm", "prometheus": "prom/prometheus:v3.4.2"}
    for name, image in upstream.items():
        first_line = standins.containerfile(ROOT, name).read_text().splitlines()[0]
        assert image in first_line, f"{name}.Containerfile says it stands in for another image than {image}"


def test_bad_names_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ContainersError, match="use one of podman, docker"):
        Engine("dockr", ROOT)
    with pytest.raises(ContainersError, match="the stand-ins are python, prometheus"):
        standins.containerfile(ROOT, "grafana")
    with pytest.raises(ContainersError, match="no checkout with Dockerfile and compose.yaml"):
        engine.repo_root(tmp_path)
    with pytest.raises(ContainersError, match="cannot read the HEALTHCHECK"):
        image_check.healthcheck_argv(["NONE"])
    assert image_check.healthcheck_argv(["CMD-SHELL", "wget -q x || exit 1"]) == [
        "/bin/sh",
        "-c",
        "wget -q x || exit 1",
    ]


def test_a_missing_engine_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine.shutil, "which", lambda name: None)
    with pytest.raises(ContainersError, match=r"podman is not installed: run `bash scripts/containers-setup.sh`"):
        Engine("podman", ROOT).require()
    with pytest.raises(ContainersError, match="install Docker Engine with the compose plugin"):
        Engine("docker", ROOT).require()


def test_podman_builds_mount_the_host_trust_files_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []

    def record(self: Engine, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(Engine, "run", record)
    eng = Engine("podman", ROOT)
    eng.build("t:1", ROOT, ROOT / "Dockerfile", host_trust=True, target="sim")
    eng.build("t:2", ROOT, ROOT / "Dockerfile")
    present = [f for f in engine.HOST_TRUST_FILES if f.is_file()]
    assert [a for a in calls[0] if a.startswith("--volume=")] == [f"--volume={f}:{f}:ro" for f in present]
    assert not [a for a in calls[1] if a.startswith("--volume=")]
    assert {"--format", "docker"} <= set(calls[0])  # OCI images would drop the HEALTHCHECK
    Engine("docker", ROOT).build("t:3", ROOT, ROOT / "Dockerfile", host_trust=True)
    assert not [a for a in calls[2] if a.startswith(("--volume", "--format"))]


class _FakeEngine:
    """``Engine.run`` (set on the class: called unbound) whose ``rm -f`` removes a container after ``sticky[name]``
    more tries."""

    def __init__(self, present: set[str], sticky: dict[str, int]) -> None:
        self.present, self.sticky, self.rm_calls = set(present), dict(sticky), 0

    def __call__(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        if args[:2] == ("rm", "-f"):
            self.rm_calls += 1
            for name in args[2:]:
                if self.sticky.get(name, 0) > 0:
                    self.sticky[name] -= 1
                else:
                    self.present.discard(name)
            return subprocess.CompletedProcess(args, 1 if self.sticky else 0, "", "Error: netavark teardown")
        assert args[:2] == ("ps", "-a"), args
        return subprocess.CompletedProcess(args, 0, "\n".join(sorted(self.present)), "")


@pytest.mark.parametrize("sticky,rm_calls,fails", [(0, 1, False), (1, 2, False), (2, 2, True)],
                         ids=["removed-at-once", "removed-on-retry", "still-there"])  # fmt: skip
def test_remove_retries_a_container_that_survives_rm(monkeypatch: pytest.MonkeyPatch, sticky, rm_calls, fails):
    fake = _FakeEngine({"a", "b", "other"}, {"a": sticky})
    monkeypatch.setattr(Engine, "run", fake)
    eng = Engine("podman", ROOT)
    if fails:
        with pytest.raises(ContainersError, match=r"rm -f a` left them in place:\n.*netavark"):
            eng.remove("a", "b", "missing")
    else:
        eng.remove("a", "b", "missing")
        assert fake.present == {"other"}
    assert fake.rm_calls == rm_calls
    eng.remove()
    assert fake.rm_calls == rm_calls


def test_compose_files_and_env_per_engine(tmp_path: Path) -> None:
    podman = compose_check.ComposeStack(Engine("podman", ROOT), "0.1.0-standins", "localhost/p:1", tmp_path / "a")
    assert [p.name for p in podman.files()] == ["compose.yaml", "compose.localhost.yaml", "compose.podman.yaml",
                                                "compose.standins.yaml"]  # fmt: skip
    assert "grafana-sim" not in podman.services
    env = dict(line.split("=", 1) for line in podman.env_file.read_text().splitlines())
    assert env["SPARSEMLA_VERSION"] == "0.1.0-standins" and env["SPARSEMLA_PROMETHEUS_IMAGE"] == "localhost/p:1"
    assert env["LOCUST_WORKERS"] == str(compose_check.WORKERS)
    assert len({env[k] for k in ("SERVER_PORT", "PROMETHEUS_PORT", "EXPORTER_PORT", "LOCUST_WEB_PORT")}) == 4
    docker = compose_check.ComposeStack(Engine("docker", ROOT), "0.1.0-test", None, tmp_path / "b")
    assert [p.name for p in docker.files()] == ["compose.yaml", "compose.localhost.yaml"]
    assert "grafana-sim" in docker.services


def test_the_standins_overlay_pulls_nothing_and_covers_the_sim_profile() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    overlay = yaml.safe_load((ROOT / "compose.standins.yaml").read_text())["services"]
    sim_profile = {n for n, s in services.items() if "sim" in s["profiles"]} - {"grafana-sim"}
    assert set(overlay) == sim_profile == set(compose_check.SERVICES)
    assert all(s["pull_policy"] == "never" for s in overlay.values())
    assert overlay["prometheus"]["image"].startswith("${SPARSEMLA_PROMETHEUS_IMAGE:?")
    podman = yaml.safe_load((ROOT / "compose.podman.yaml").read_text())["services"]
    assert podman["locust-worker"]["pid"] == "container:${COMPOSE_PROJECT_NAME}_locust_1"
    assert services["locust-worker"]["pid"] == "service:locust"  # what the podman overlay translates


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="apt-get install docker-compose")
def test_the_overlays_validate_with_compose_yaml(tmp_path: Path) -> None:
    env_file = tmp_path / "test.env"
    env_file.write_text("GRAFANA_ADMIN_PASSWORD=x\nSPARSEMLA_PROMETHEUS_IMAGE=localhost/p:1\nCOMPOSE_PROJECT_NAME=p\n")
    argv = ["docker-compose", "--env-file", str(env_file)]
    for name in ("compose.yaml", "compose.localhost.yaml", "compose.podman.yaml", "compose.standins.yaml"):
        argv += ["-f", str(ROOT / name)]
    env = flags.child_env(dict.fromkeys(compose_check.SHELL_VARS))
    done = subprocess.run([*argv, "--profile", "sim", "config"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)["services"]
    assert rendered["prometheus"]["image"] == "localhost/p:1"
    assert rendered["locust-worker"]["pid"] == "container:p_locust_1"
