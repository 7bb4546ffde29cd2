"""docs/ stays true: the performance page is regenerated from the committed benchmark JSON, and every results file it
cites names the GPU, versions, git sha and shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import report

ROOT = Path(__file__).resolve().parents[1]


def test_performance_md_is_generated_from_the_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)  # the page cites its sources by repo-relative path
    committed = Path("docs/performance.md").read_text()
    assert committed == report.render(Path("results/bench")), (
        "docs/performance.md is stale: run `python -m benchmarks.report`"
    )


@pytest.mark.parametrize("op", sorted(report.SECTIONS))
def test_each_op_has_a_committed_h200_result_with_provenance(op):
    path = report.newest(ROOT / "results" / "bench", op)
    assert path is not None, f"no results/bench/{op}-*.json committed"
    data = json.loads(path.read_text())
    assert data["op"] == op
    assert "H200" in data["gpu"]
    assert len(data["git_sha"]) >= 7
    assert data["rows"], "a result without measured rows"
    if op != "step":
        versions = data.get("versions", data)  # step_v32 keeps them under "versions"
        assert versions.get("torch") and versions.get("triton")
