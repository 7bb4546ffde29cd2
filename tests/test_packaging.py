"""One distribution, one import namespace: the mapped folders install under `sparsemla.`, never as top-level names."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_top_level_folders_are_mapped_under_sparsemla():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert conf["package-dir"] == {
        "sparsemla": "sparsemla",
        "sparsemla.kernels": "kernels",
        "sparsemla.deploy": "deploy",
        "sparsemla.loadtest": "loadtest",
        "sparsemla.dashboards": "dashboards",
    }
    for pkg in conf["packages"]:
        assert pkg == "sparsemla" or pkg.startswith("sparsemla."), pkg


def test_every_python_package_folder_is_listed():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = {v: k for k, v in conf["package-dir"].items()}
    found = set()
    for init in ROOT.glob("*/**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[0] not in mapping or rel.parts[0] == "tests":
            continue
        found.add(".".join([mapping[rel.parts[0]], *rel.parts[1:]]))
    assert found == set(conf["packages"]), f"pyproject packages differ: {found ^ set(conf['packages'])}"


def test_the_wheel_installs_nothing_top_level_but_sparsemla(tmp_path):
    """Build the real wheel and look at its top-level names: `kernels` etc. must only exist under `sparsemla/`."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("sparsemla-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"sparsemla"}, top
    for sub in ("kernels", "deploy", "loadtest", "dashboards"):
        assert f"sparsemla/{sub}/__init__.py" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert (
        "[sglang.srt.plugins]" in entry_points and "sparsemla = sparsemla.deploy.sglang_plugin:register" in entry_points
    )


def test_public_ops_import_from_the_namespace():
    from sparsemla.kernels import indexer_logits, indexer_topk, sparse_decode

    assert callable(sparse_decode) and callable(indexer_logits) and callable(indexer_topk)


def test_kernels_import_nothing_from_the_ops_side():
    for path in (ROOT / "kernels").rglob("*.py"):
        text = path.read_text()
        for other in ("sparsemla.deploy", "sparsemla.loadtest", "sparsemla.dashboards"):
            assert other not in text, f"{path.relative_to(ROOT)} imports {other}"


def test_triton_paths_never_import_their_reference():
    for path in (ROOT / "kernels").glob("*/triton.py"):
        assert "reference" not in "\n".join(
            line for line in path.read_text().splitlines() if line.lstrip().startswith(("import", "from"))
        ), path
