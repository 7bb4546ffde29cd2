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


# What the in-sglang areas may import from the package besides themselves (docs/architecture.md's table): leaf modules
# only, so the GPU image's runtime carries nothing of the ops tools. Names of the package root's own attributes
# (`from sparsemla import __version__`) are listed whole.
ALLOWED = {
    "kernels": {"sparsemla.flags", "sparsemla.console"},
    "plugin": {"sparsemla.kernels", "sparsemla.flags", "sparsemla.variant", "sparsemla.metric_names",
               "sparsemla.SGLANG_VERSION", "sparsemla.__version__"},
}  # fmt: skip


def _outside_imports(area: str, allowed: set[str]) -> list[str]:
    allowed = allowed | {f"sparsemla.{area}"}
    return [
        f"{f.relative_to(PKG)} imports {name}"
        for f in sorted((PKG / area).rglob("*.py"))
        for name in sorted(_imports(f))
        if name.startswith("sparsemla.") and not any(name == a or name.startswith(a + ".") for a in allowed)
    ]


@pytest.mark.parametrize("area", sorted(ALLOWED))
def test_runtime_areas_import_only_their_leaves(area):
    assert not _outside_imports(area, ALLOWED[area])


def test_the_leaf_check_sees_an_import():
    # without its CLI helper on the list, kernels/cli.py's `from sparsemla.console import fail` is reported
    assert _outside_imports("kernels", {"sparsemla.flags"}) == [
        "kernels/cli.py imports sparsemla.console",
        "kernels/cli.py imports sparsemla.console.fail",
    ]


def test_triton_paths_never_import_their_reference():
    paths = sorted((PKG / "kernels").glob("*/triton*.py"))
    assert len(paths) >= 4
    for path in paths:
        assert not [n for n in _imports(path) if "reference" in n], path
