"""`make test-containers`: the images built and run for real, with podman, on this project's Debian machines.

No registry is reachable here, so the base images are local stand-ins (``deploy/containers/``: a debootstrap Debian,
Debian's python3.11 for ``python:3.11.13-slim-bookworm``, Debian's prometheus for ``prom/prometheus``), cached in
podman's image store under a hash of their recipe. On them Dockerfile's ``sim`` target is built through
``PYTHON_IMAGE``, run (HEALTHCHECK, endpoints, a 20 s load test at C=8 from the host), and compose.yaml's ``sim``
profile is brought up with podman-compose and checked end to end (sparsemla.ops.containers.compose_check).

Grafana is the one service not started: it has no stand-in (Debian does not package it) and no registry serves it
here. The dashboards' queries still run, against the compose Prometheus, the way Grafana would run them.

Marked ``containers``: `make test` leaves these out (minutes of image builds); `make test-containers` and `.ci/run`
run them, after scripts/containers-setup.sh installed the tools. A missing tool fails the test, never skips it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Needs the ops extras (the compose check reads the dashboards): the GPU machine installs the runtime only.
pytest.importorskip("grafana_foundation_sdk")
from sparsemla.ops.containers import compose_check, image_check, standins  # noqa: E402
from sparsemla.ops.containers.engine import ContainersError, Engine, exclusive  # noqa: E402
from sparsemla.procs import sigterm_as_interrupt  # noqa: E402

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[containers] {message}", flush=True)


def _processes_naming(word: str) -> list[str]:
    """Command lines of live processes that mention ``word`` (conmon carries its container's name)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if word in text and "pytest" not in text:
            found.append(text.strip())
    return found


@pytest.fixture(scope="module", autouse=True)
def _sigterm_unwinds():  # noqa: ANN202
    """SIGTERM (a CI timeout) unwinds like Ctrl-C, so the checks' cleanup (`finally`) runs."""
    with sigterm_as_interrupt():
        yield


@pytest.fixture(scope="module")
def engine() -> Engine:
    eng = Engine("podman", ROOT)
    try:
        eng.require()
    except ContainersError as exc:
        pytest.fail(f"the container test cannot run here: {exc}")
    return eng


@pytest.fixture(scope="module")
def images(engine: Engine):  # noqa: ANN201
    with exclusive(log):
        yield standins.prepare_images(engine, registry=False, log=log)


def test_standins_are_cached_under_their_recipe(engine: Engine, images: standins.Images) -> None:
    again = standins.ensure_standins(engine, log)
    assert all(again.reused.values()), again.reused
    assert (again.python, again.prometheus) == (images.standins.python, images.standins.prometheus)
    assert engine.image_exists(images.ops)
    # The GPU image keeps its build-time check; the sim image now has one too (the CLI starts without torch).
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "entry_points(group='sglang.srt.plugins')" in dockerfile and "sparsemla sim --help" in dockerfile


def test_sim_image_is_healthy_serves_and_takes_load(engine: Engine, images: standins.Images, tmp_path: Path) -> None:
    result = image_check.check_image(engine, images.ops, tmp_path, log)
    assert result.summary["requests"] > 0 and result.summary["failure_rate"] == 0
    assert engine.containers(f"label={image_check.LABEL}") == []
    assert _processes_naming(image_check.CONTAINER) == []


def test_compose_sim_profile_end_to_end(engine: Engine, images: standins.Images, tmp_path: Path) -> None:
    stack = compose_check.ComposeStack(engine, images.ops_version, images.prometheus, tmp_path)
    assert "grafana-sim" not in stack.services  # no stand-in for Grafana (see the module docstring)
    result = compose_check.check_compose(stack, log)
    assert result.checked >= 40
    assert {profile for profile in result.empty.values()} <= {"gpu"}
    assert stack.containers() == []
    assert _processes_naming(compose_check.PROJECT) == []
