"""The wheel holds what each image needs, under `sparsemla/` only; the GPU image's runtime wheel holds nothing else.

Both wheels are really built: the full one (the sim/ops image installs it with the ``ops,loadtest`` extras) from the
checkout, the runtime one from exactly the files the Dockerfile's ``gpu`` stage copies.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Files each image reads at run time (package data and the modules behind its commands).
OPS_IMAGE_NEEDS = (
    "sparsemla/cli.py",
    "sparsemla/ops/sim/server.py",
    "sparsemla/ops/sim/calibration/default.json",
    "sparsemla/ops/sim/calibration/provisional.json",
    "sparsemla/ops/exporter.py",
    "sparsemla/ops/prometheus/prometheus.yml",
    "sparsemla/ops/prometheus/recording.rules.yml",
    "sparsemla/ops/prometheus/alerts.rules.yml",
    "sparsemla/ops/grafana/provisioning/datasources/prometheus.yaml",
    "sparsemla/loadtest/locustfile.py",
    "sparsemla/dashboards/generated/sparsemla-serving.json",
)
RUNTIME_NEEDS = (
    "sparsemla/__init__.py",
    "sparsemla/flags.py",
    "sparsemla/variant.py",
    "sparsemla/kernels/sparse_decode/triton.py",
    "sparsemla/kernels/indexer/triton.py",
    "sparsemla/plugin/sglang.py",
    "sparsemla/plugin/selfcheck.py",
    "sparsemla/plugin/step_metrics.py",
)
FORBIDDEN_TOP_LEVEL = {"kernels", "deploy", "loadtest", "dashboards", "benchmarks", "tests", "plugin", "ops"}


def _wheel(src: Path, out: Path) -> list[str]:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("sparsemla-*.whl")
    return zipfile.ZipFile(wheel).namelist()


def _gpu_stage_tree(dest: Path) -> None:
    """Copy what the Dockerfile's gpu stage COPYs (its COPY lines, continuation lines joined) into ``dest``."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stage = text.split("AS gpu", 1)[1]
    copies = [line.split()[1:] for line in stage.splitlines() if line.startswith("COPY ")]
    assert copies, "no COPY line in the gpu stage"
    for args in copies:
        *sources, target = args
        for source in sources:
            src = ROOT / source
            if src.is_dir():
                shutil.copytree(src, dest / target.removeprefix("./"), ignore=shutil.ignore_patterns("__pycache__"))
            else:
                where = dest / target.removeprefix("./")
                where.mkdir(parents=True, exist_ok=True) if target.endswith("/") else where.parent.mkdir(parents=True)
                shutil.copy(src, where / src.name if target.endswith("/") else where)


def test_each_image_gets_what_it_needs_and_no_top_level_module_but_sparsemla(tmp_path):
    names = _wheel(ROOT, tmp_path / "full")
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"sparsemla"}, f"top-level names besides sparsemla: {top - {'sparsemla'}}"
    missing = [n for n in (*OPS_IMAGE_NEEDS, *RUNTIME_NEEDS) if n not in names]
    assert not missing, f"the wheel lacks {missing}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(next((tmp_path / "full").glob("*.whl"))) as whl:
        text = whl.read(entry_points).decode()
    assert re.search(r"\[sglang\.srt\.plugins\]\s*sparsemla = sparsemla\.plugin\.sglang:register", text), text

    # The GPU image: the runtime only, and it imports and registers with nothing else installed from this repo.
    tree = tmp_path / "gpu-context"
    _gpu_stage_tree(tree)
    runtime = _wheel(tree, tmp_path / "gpu")
    assert not [n for n in RUNTIME_NEEDS if n not in runtime], "the gpu stage misses runtime modules"
    shipped = {n.split("/")[1] for n in runtime if n.startswith("sparsemla/") and n.count("/") >= 2}
    assert shipped == {"kernels", "plugin"}, f"the gpu image ships {shipped}"
    site = tmp_path / "site"
    with zipfile.ZipFile(next((tmp_path / "gpu").glob("*.whl"))) as whl:
        whl.extractall(site)
    probe = (
        "import sys, importlib.util\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in type(f).__module__]\n"
        "import sparsemla.plugin.sglang as p, sparsemla.cli as cli\n"
        f"assert p.__file__.startswith({str(site)!r}), p.__file__\n"
        "assert importlib.util.find_spec('sparsemla.ops') is None\n"
        "print(sorted(c.name for c in cli.app.registered_commands))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'aot'" in out.stdout and "'flags'" in out.stdout and "'sim'" not in out.stdout, out.stdout


OPS_TEST_MODULES = ("grafana_foundation_sdk", "fastapi", "geventhttpclient", "locust", "promql_parser", "httpx")


def test_the_cpu_suite_has_every_extra_its_modules_skip_without():
    """Some test modules skip when the ops/loadtest extras are absent (the GPU machine installs the runtime only);
    `make test` installs them, so here their absence is a failure, not a silent skip."""
    import importlib.util

    import torch

    if torch.cuda.is_available():
        pytest.skip("GPU machine: the runtime only is installed there")
    missing = [m for m in OPS_TEST_MODULES if importlib.util.find_spec(m) is None]
    assert not missing, f"`make setup` did not install {missing}"


_BLOCKED_RUNNER = """
import importlib.abc, sys
BLOCK = {blocked!r}
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Blocked())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-p", "no:schemathesis"]))
"""


def test_the_gpu_tier_collects_where_only_the_runtime_is_installed(tmp_path):
    """`pytest -m gpu` on the GPU machine (runtime + torch, no ops extras): every module collects or skips."""
    script = tmp_path / "collect.py"
    ops_only = ("fastapi", "starlette", "uvicorn", "grafana_foundation_sdk", "locust", "gevent", "geventhttpclient")
    blocked = sorted({*ops_only, "promql_parser", "sglang", "jsonschema_rs", "schemathesis"})
    script.write_text(_BLOCKED_RUNNER.format(blocked=blocked))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " tests collected" in out.stdout and "error" not in out.stdout.lower().split("tests collected")[-1]
