"""`sparsemla demo --out` deletes only a demo's own report folder: a typed path never costs anyone their data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparsemla.console import UsageError
from sparsemla.ops import demo


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _foreign_tree(root: Path) -> None:
    rng = random.Random(7)
    (root / "runs" / "old").mkdir(parents=True)
    for name in ("runs/old/summary.json", "notes.txt", "runs/keep.bin"):
        (root / name).write_bytes(bytes(rng.randrange(256) for _ in range(64)))


@pytest.mark.parametrize("where", ["results-root", "home-like"], ids=["results-root", "home-like"])
def test_demo_refuses_an_out_it_did_not_write_and_deletes_nothing(tmp_path: Path, where: str) -> None:
    out = tmp_path / where
    _foreign_tree(out)
    before = _files(out)
    result = CliRunner().invoke(demo.app, ["--out", str(out), "--point-seconds", "1", "--no-prometheus"])
    assert result.exit_code == 2, result.output
    assert "not written by a demo" in result.output and "nothing was deleted" in result.output
    assert _files(out) == before


def test_an_earlier_demo_folder_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    demo.clear_report_dir(out)
    (out / "a-flag-off").mkdir()
    (out / "a-flag-off" / "summary.json").write_text("{}")
    demo.clear_report_dir(out)
    assert sorted(p.name for p in out.iterdir()) == [demo.DEMO_MARKER]


def test_a_finished_demo_from_before_the_marker_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    (out / "demo.json").write_text("{}")
    (out / "report.md").write_text("# old")
    demo.clear_report_dir(out)
    assert sorted(p.name for p in out.iterdir()) == [demo.DEMO_MARKER]


@pytest.mark.parametrize("kind", ["symlink", "file"], ids=["symlink", "file"])
def test_out_that_is_not_a_plain_directory_is_refused(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "elsewhere"
    _foreign_tree(target)
    out = tmp_path / "out"
    if kind == "symlink":
        (target / demo.DEMO_MARKER).write_text("a marker behind a link must not make the link's target ours")
        out.symlink_to(target, target_is_directory=True)
    else:
        out.write_text("data")
    before = _files(target)
    with pytest.raises(UsageError, match="not a directory"):
        demo.clear_report_dir(out)
    assert _files(target) == before
    assert out.exists()
