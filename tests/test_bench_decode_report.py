"""benchmarks/report_decode.py's explore tables on synthetic JSON (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import report_decode


def test_occupancy_lines_render_each_targets_run_with_the_fastest_in_bold(tmp_path: Path):
    explore = tmp_path / "results" / "bench" / "explore"
    explore.mkdir(parents=True)
    assert report_decode.occupancy_lines(explore) == []  # no run: no section
    rows = [
        {"B": 64, "H": 8, "cfg": "auto", "us_t38": 32.0, "us_t38occ": 33.2},
        {"B": 64, "H": 8, "cfg": "16:32:4:1:1c/s2", "us_t38": 32.5, "us_t38occ": 41.4},
        {"B": 128, "H": 64, "cfg": "auto", "us_t38": 101.0, "us_t38occ": 150.0},
        {"B": 128, "H": 64, "cfg": "16:32:4:1:1c/s2", "us_t38": 99.0, "us_t38occ": 147.0},
        {"B": 128, "H": 64, "cfg": "32:32:4:1:1c/s1", "us_t38": 98.0, "error_t38occ": "no cubin"},
    ]
    meta = {"occupancy_of": "sm_89", "code": "abc1234"}
    (explore / "decode_t38_configs_occupancy3_sm89-h200.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    md = "\n".join(report_decode.occupancy_lines(explore))
    assert "sm_89 (`results/bench/explore/decode_t38_configs_occupancy3_sm89-h200.json`, commit `abc1234`)" in md
    assert "| B | H | `auto` | `16:32:4:1:1c/s2` | `32:32:4:1:1c/s1` |" in md
    assert "| 64 | 8 | **33.2** | 41.4 | - |" in md  # the target-occupancy times, not the H200's
    assert "| 128 | 64 | 150 | **147** | - |" in md  # a failed or missing cell is `-`
    assert report_decode.OCCUPANCY_NOTE in md


def test_occupancy_provider_needs_a_known_target_and_cubins():
    """`--occupancy-of` is refused loudly (exit 2, what to fix) for an unknown target or without 3.8 cubins."""
    from typer.testing import CliRunner

    from benchmarks import decode

    runner = CliRunner()
    bad = runner.invoke(decode.app, ["--occupancy-of", "sm_99", "--cubins", "x"])
    assert bad.exit_code == 2 and "unknown target" in bad.output
    wgmma = runner.invoke(decode.app, ["--occupancy-of", "sm_90", "--cubins", "x"])
    assert wgmma.exit_code == 2 and "wgmma" in wgmma.output
    alone = runner.invoke(decode.app, ["--occupancy-of", "sm_89"])
    assert alone.exit_code == 2 and "--occupancy-of needs --cubins" in alone.output


def _paths_run(gpu: str, date: str, sha: str, native: float, sm89: float) -> dict:
    cell = {"B": 64, "H": 64, "swa_topk": 128, "extra_topk": 512}
    return {
        "gpu": gpu,
        "date": date,
        "git_sha": sha,
        "rows": [
            {**cell, "provider": "sparsemla_t38_graph", "us": native},
            {**cell, "provider": "sparsemla_sm89path_t38_graph", "us": sm89},
        ],
    }


def test_t38_tables_newest_run_per_gpu_by_date(tmp_path: Path) -> None:
    """One both-path table per GPU, the newest run of each by its date (not by file name), H200 first."""
    from benchmarks.report_decode import t38_lines

    explore = tmp_path / "results" / "bench" / "explore"
    explore.mkdir(parents=True)
    h100 = "NVIDIA H100 80GB HBM3"
    runs = {
        "decode_paths_t38-h200-2026-12-05d.json": _paths_run("NVIDIA H200", "2026-12-05T19:00", "h200new", 46.0, 50.0),
        "decode_paths_t38-h200-2026-12-05c.json": _paths_run("NVIDIA H200", "2026-12-05T17:00", "h200old", 47.0, 51.0),
        "decode_paths_t38-h100-2026-12-06.json": _paths_run(h100, "2026-12-06T00:30", "h100new", 45.0, 60.0),
        "decode_paths_t38-h100-2026-12-07z.json": _paths_run(h100, "2026-12-05T10:00", "h100old", 1.0, 1.0),
    }
    for name, data in runs.items():
        (explore / name).write_text(json.dumps(data))
    md = "\n".join(t38_lines(explore))
    assert "commit `h200new`" in md and "commit `h100new`" in md
    assert "h200old" not in md and "h100old" not in md
    assert md.index("NVIDIA H200") < md.index("NVIDIA H100")
    assert "| 64 | 64 | - | 46.0 | - | 50.0 | 1.09x | 55 (met) |" in md
    assert "| 64 | 64 | - | 45.0 | - | 60.0 | 1.33x (over 1.3x) | 55 (missed) |" in md
