"""Dependencies run one way: kernels import nothing above them, the plugin nothing of the ops tools, and a Triton
fast path never imports its torch reference."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "sparsemla"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize(
    ("area", "forbidden"),
    [
        ("kernels", ("sparsemla.plugin", "sparsemla.ops", "sparsemla.loadtest", "sparsemla.dashboards", "benchmarks")),
        ("plugin", ("sparsemla.ops", "sparsemla.loadtest", "sparsemla.dashboards", "benchmarks")),
        # the A/B report renders the dashboards' panels; it reaches the servers over HTTP/PromQL only
        ("loadtest", ("sparsemla.kernels", "sparsemla.plugin", "benchmarks")),
        ("dashboards", ("sparsemla.kernels", "sparsemla.plugin", "sparsemla.loadtest", "benchmarks")),
    ],
    ids=["kernels", "plugin", "loadtest", "dashboards"],
)
def test_area_imports_nothing_above_it(area, forbidden):
    files = sorted((PKG / area).rglob("*.py"))
    assert files
    bad = [
        f"{f.relative_to(PKG)} imports {name}"
        for f in files
        for name in _imports(f)
        if any(name == x or name.startswith(x + ".") for x in forbidden)
    ]
    assert not bad, bad


def test_triton_paths_never_import_their_reference():
    paths = sorted((PKG / "kernels").glob("*/triton.py"))
    assert len(paths) >= 2
    for path in paths:
        assert not [n for n in _imports(path) if "reference" in n], path
