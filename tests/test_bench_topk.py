"""The top-k benchmark without a GPU: its CLI validates before touching CUDA, the issue's targets are evaluated from
measured rows (never hard-coded verdicts), and docs/performance.md renders its JSON or says it is not measured yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import report, report_topk, topk


def _row(provider: str, b: int, length: int, k: int | None, us: float | None, path: str = "native", **kw) -> dict:
    us20 = kw.pop("us20", None if us is None else us / 2)
    row = {"path": path, "provider": provider, "B": b, "length": length, "cap": max(length, 65536), "k": k}
    return {**row, "us_graph": us, "us_graph20": us20, "exact": kw.pop("exact", True), **kw}


def _verdict(verdicts: list[dict], target: str, path: str = "native", method: str = "graph") -> dict:
    (v,) = [v for v in verdicts if (v["target"], v["path"], v["method"]) == (target, path, method)]
    return v


SYNTHETIC = [
    _row("sparsemla_split", 64, 4096, 512, 8.0),
    _row("torch_topk", 64, 4096, 512, 20.0),
    _row("sparsemla_split", 64, 16384, 512, 25.0),  # over the 20 us limit
    _row("torch_topk", 64, 16384, 512, 60.0),
    _row("sparsemla_split", 64, 4096, 2048, 15.0),  # over 13 us, but faster than sglang's v2 below
    _row("sglang_jit_v2", 64, 4096, 2048, 20.0),
    _row("sglang_jit_v1", 64, 4096, 2048, None, error="RuntimeError: topk_v1.cuh supports k <= 1024"),
    _row("sparsemla_split", 64, 16384, 2048, 17.0),  # over 16 us and no sglang row: unknown
    _row("sparsemla_split", 64, 65536, 2048, 30.0, exact=False),  # fast but wrong
    _row("sparsemla_fused", 1, 4096, 512, 16.0),
    _row("sparsemla_logits_topk", 1, 4096, 512, 14.0),
    _row("sparsemla_logits", 1, 4096, None, 7.0),
    _row("sparsemla_split", 64, 4096, 512, 9.0, path="sm89", us20=12.0),
]


def test_targets_are_the_issue_constants_in_one_dict():
    limits = {tid: t["limit_us"] for tid, t in topk.TARGETS.items()}
    assert limits == {
        "k512_B64_4k": 10.0, "k512_B64_16k": 20.0, "k512_B64_64k": 40.0,
        "k2048_B64_4k": 13.0, "k2048_B64_16k": 16.0, "k2048_B64_64k": 38.0,
        "fused_k512_B1_4k": 15.0,
    }  # fmt: skip
    assert all(topk.TARGETS[f"k512_B64_{n}"]["ratio_to"] == ("torch_topk", 0.5) for n in ("4k", "16k", "64k"))


def test_target_evaluation_from_synthetic_rows():
    verdicts = topk.evaluate_targets(SYNTHETIC)
    # every target x path x method gets a verdict
    assert len(verdicts) == len(topk.TARGETS) * 2 * len(topk.METHODS)
    v = _verdict(verdicts, "k512_B64_4k")
    assert v["pass"] is True and v["measured_us"] == 8.0 and v["conditions"][1]["ref_us"] == 20.0
    assert _verdict(verdicts, "k512_B64_16k")["pass"] is False  # 25 > 20 (although < 60 / 2)
    missing = _verdict(verdicts, "k512_B64_64k")
    assert missing["pass"] is None and missing["why"] == "not measured"
    assert _verdict(verdicts, "k2048_B64_4k")["pass"] is True  # "any": faster than sglang v2 (v1's error row ignored)
    unknown = _verdict(verdicts, "k2048_B64_16k")
    assert unknown["pass"] is None and "published 16.0 us" in unknown["conditions"][1]["why"]
    assert _verdict(verdicts, "k2048_B64_64k")["pass"] is False  # not exact: fails whatever the time
    fused = _verdict(verdicts, "fused_k512_B1_4k")
    assert fused["pass"] is True and fused["provider"] == "sparsemla_logits_topk" and fused["measured_us"] == 14.0
    # the sm89 path is judged on its own rows against the native torch.topk of the same run, per method
    assert _verdict(verdicts, "k512_B64_4k", "sm89", "graph")["pass"] is True  # 9 <= 10 and <= 20 / 2
    s89 = _verdict(verdicts, "k512_B64_4k", "sm89", "graph20")
    assert s89["pass"] is False and s89["measured_us"] == 12.0  # 12 > 10
    assert _verdict(verdicts, "k512_B64_4k", "native", "graph20")["measured_us"] == 4.0


def test_combine_modes():
    assert topk._combine([True, None], "all") is None
    assert topk._combine([True, False, None], "all") is False
    assert topk._combine([False, None], "any") is None
    assert topk._combine([False, True], "any") is True


def test_cli_rejects_a_bad_provider_with_the_valid_ones():
    result = CliRunner().invoke(topk.app, ["--providers", "sparsemla_split,bogus"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "bogus" in text and all(p in text.replace(", ", ",").replace(" ", "") for p in topk.PROVIDERS)


@pytest.mark.parametrize("args", [["--ks", "512,7"], ["--batches", "x"], ["--paths", "ampere"]])
def test_cli_rejects_bad_shapes_and_paths(args):
    assert CliRunner().invoke(topk.app, args).exit_code == 2


def test_cli_parses_and_lists_its_options():
    result = CliRunner().invoke(topk.app, ["--help"])
    assert result.exit_code == 0
    for opt in ("--providers", "--batches", "--lengths", "--ks", "--paths", "--sglang-src", "--git-sha"):
        assert opt in result.output
    assert topk.parse_providers(" torch_topk,sglang_jit_v2 ,torch_topk") == ["torch_topk", "sglang_jit_v2"]


@pytest.mark.parametrize("provider", [topk.T38, topk.FUSED_T38])
def test_triton38_provider_needs_cubins_and_is_not_in_the_default_list(tmp_path, provider):
    assert provider in topk.PROVIDERS and provider not in topk.DEFAULT_PROVIDERS
    alone = CliRunner().invoke(topk.app, ["--providers", provider])
    assert alone.exit_code == 2 and provider in alone.output
    assert "--cubins" in alone.output and "--build-cubins" in alone.output
    empty = CliRunner().invoke(topk.app, ["--cubins", str(tmp_path)])
    assert empty.exit_code == 2 and "manifest.json" in empty.output


def test_targets_take_the_best_of_the_jit_and_the_triton38_rows():
    rows = [
        _row("sparsemla_split", 64, 4096, 512, 12.0),
        _row(topk.T38, 64, 4096, 512, 9.0),
        _row("torch_topk", 64, 4096, 512, 30.0),
        _row(topk.T38, 64, 16384, 512, 5.0, exact=False),  # fastest but wrong: the target fails, loudly
        _row("sparsemla_split", 64, 16384, 512, 19.0),
        _row("torch_topk", 64, 16384, 512, 60.0),
    ]
    verdicts = topk.evaluate_targets(rows)
    v4k = _verdict(verdicts, "k512_B64_4k")
    assert v4k["pass"] is True and v4k["provider"] == topk.T38 and v4k["measured_us"] == 9.0
    v16k = _verdict(verdicts, "k512_B64_16k")
    assert v16k["pass"] is False and v16k["provider"] == topk.T38 and v16k["exact"] is False


def test_fused_target_takes_the_triton38_fused_row():
    rows = [_row("sparsemla_fused", 1, 4096, 512, 30.0), _row(topk.FUSED_T38, 1, 4096, 512, 28.0)]
    v = _verdict(topk.evaluate_targets(rows), "fused_k512_B1_4k")
    assert v["pass"] is False and v["provider"] == topk.FUSED_T38 and v["measured_us"] == 28.0
    v20 = _verdict(topk.evaluate_targets(rows), "fused_k512_B1_4k", method="graph20")
    assert v20["pass"] is True and v20["provider"] == topk.FUSED_T38 and v20["measured_us"] == 14.0


BUILD_CHILD = """
import json, sys
from pathlib import Path
from benchmarks import topk
out, code_path = Path(sys.argv[1]), sys.argv[2]
added = topk.build_cubins_for({"B": [1], "lengths": [4096], "k": [512]}, out, code_path)
manifest = json.loads((out / "manifest.json").read_text())
print(json.dumps(dict(added=added, kernels=sorted(e["name"] for e in manifest.values()),
                      paths=sorted({e["code_path"] for e in manifest.values()}))))
"""


@pytest.mark.parametrize("code_path", ["native", "sm89"])
def test_build_cubins_compiles_the_split_and_the_fused_launches(tmp_path, code_path):
    """--build-cubins makes what both Triton 3.8 providers replay in each code path: the split top-k launch and, at
    the fused length, the fused logits launch (Triton's compiler in a child process: this session's kernels are
    interpreted)."""
    import subprocess
    import sys

    from sparsemla import flags

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "child.py").write_text(BUILD_CHILD)
    env = flags.child_env({"TRITON_INTERPRET": None, "PYTHONPATH": f"{root}:{root / 'src'}",
                           "TRITON_CACHE_DIR": str(tmp_path / "cache")})  # fmt: skip
    proc = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "cubins"), code_path], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "_indexer_topk_kernel" in got["kernels"] and "_indexer_logits_kernel" in got["kernels"]
    assert got["added"] == len(got["kernels"]) and got["paths"] == [code_path]


def test_child_argv_replaces_the_parents_path_options():
    argv = topk._child_argv(["--paths", "native,sm89", "--ks=512", "--child-out=/x"], "sm89", Path("/tmp/o.json"))
    assert argv[1:] == ["-m", "benchmarks.topk", "--ks=512", "--paths", "sm89", "--child-out", "/tmp/o.json"]


@pytest.mark.parametrize("workers", [1, 3, 8, 40])
def test_warm_chunks_deal_every_point_once_largest_first(workers):
    batches, lengths = [1, 8, 64], [1024, 4096, 16384, 65536, 262144]
    chunks = topk.warm_chunks(batches, lengths, workers)
    assert len(chunks) == min(workers, 15) and all(chunks)
    dealt = [pair for chunk in chunks for pair in chunk]
    assert sorted(dealt) == sorted((b, n) for b in batches for n in lengths)
    assert [chunk[0] for chunk in chunks][0] == (64, 262144)  # the largest inputs are made first, in parallel
    for chunk in chunks:
        assert [b * n for b, n in chunk] == sorted((b * n for b, n in chunk), reverse=True)


def test_warm_only_points_parse_and_bad_ones_exit_2():
    assert topk.parse_pairs("1:1024, 64:4096") == [(1, 1024), (64, 4096)]
    for bad in ("", "1024", "1:2:3", "0:1024", "a:b"):
        with pytest.raises(ValueError, match="B:length"):
            topk.parse_pairs(bad)
    result = CliRunner().invoke(topk.app, ["--warm-only", "64x4096"])
    assert result.exit_code == 2 and "B:length" in " ".join(result.output.split())


def test_warm_up_only_compiles_this_tritons_providers(monkeypatch):
    """torch, sglang and the 3.8 cubins' providers compile nothing here: no warm-up process for them."""
    started = []
    monkeypatch.setattr(topk.subprocess, "Popen", lambda *a, **kw: started.append(a) or pytest.fail("started"))
    cfg = {"B": [64], "lengths": [4096], "k": [512]}
    assert topk.warm_up("native", ["torch_topk", "sglang_jit_v2", "sparsemla_split_t38"], cfg, 0, 8) == 0.0
    assert topk.warm_up("native", ["sparsemla_split"], cfg, 0, 0) == 0.0
    assert not started


class _FakeProc:
    def __init__(self, cmd, env, rc):  # noqa: ANN001
        self.cmd, self.env, self.rc, self.killed = cmd, env, rc, False

    def wait(self, timeout=None):  # noqa: ANN001, ANN202
        if self.rc is None and not self.killed:
            raise topk.subprocess.TimeoutExpired(self.cmd, timeout)
        return self.rc

    def kill(self) -> None:
        self.killed = True


def test_warm_up_runs_in_the_paths_environment_and_survives_failing_processes(monkeypatch, capsys):
    """Each warm-up process gets the code path's environment (TRITON_OVERRIDE_ARCH for sm89) and its share of the
    points; one that exits non-zero, one that hangs (stopped at the deadline) and one that cannot start only cost
    their share of the speed-up."""
    outcomes = iter([0, 1, None, OSError("no fork")])
    procs = []

    def fake_popen(cmd, env):  # noqa: ANN001, ANN202
        rc = next(outcomes)
        if isinstance(rc, OSError):
            raise rc
        procs.append(_FakeProc(cmd, env, rc))
        return procs[-1]

    monkeypatch.setattr(topk.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(topk, "WARM_TIMEOUT_S", 0.0)
    cfg = {"B": [1, 64], "lengths": [1024, 4096], "k": [512, 2048]}
    assert topk.warm_up("sm89", ["sparsemla_split", "torch_topk"], cfg, 3, 4) >= 0.0
    assert len(procs) == 3 and procs[2].killed
    assert all(p.env.get("TRITON_OVERRIDE_ARCH") == "sm89" for p in procs)
    points = [p.cmd[p.cmd.index("--warm-only") + 1] for p in procs]
    assert points == ["64:4096", "64:1024", "1:4096"]  # the fourth share (1:1024) could not start
    assert all(p.cmd[p.cmd.index("--providers") + 1] == "sparsemla_split" for p in procs)
    assert all(p.cmd[p.cmd.index("--ks") + 1] == "512,2048" for p in procs)
    assert "3 of 4 processes failed" in capsys.readouterr().out


def test_warm_points_make_the_timed_calls(monkeypatch):
    """The warm-up's calls are the timed loop's (same launchers, same arguments), here on the interpreter at a small
    capacity: each chosen provider once per point and k, the fused ones at FUSED_LENGTH only, and every call runs."""
    from sparsemla.kernels.indexer import topk as topk_kernels
    from sparsemla.kernels.indexer import triton as indexer_triton

    seen = []

    def spy(name, real):  # noqa: ANN001, ANN202
        return lambda *a, **kw: seen.append((name, kw.get("sorted"), kw.get("fuse"))) or real(*a, **kw)

    monkeypatch.setattr(topk_kernels, "indexer_topk_fwd", spy("split", topk_kernels.indexer_topk_fwd))
    monkeypatch.setattr(indexer_triton, "indexer_logits_topk_fwd", spy("fused", indexer_triton.indexer_logits_topk_fwd))
    monkeypatch.setattr(topk, "CAP_MIN", 2048)
    monkeypatch.setattr(topk, "FUSED_LENGTH", 1024)
    chosen = ["sparsemla_split", "sparsemla_split_sorted", "sparsemla_fused", "torch_topk"]
    calls = topk.warm_points([(2, 1024), (1, 700)], chosen, [512], seed=0, device="cpu")
    assert calls == len(seen) == 5
    assert seen == [("split", False, None), ("split", True, None), ("fused", False, True),
                    ("split", False, None), ("split", True, None)]  # fmt: skip


def _synthetic_json() -> dict:
    return {
        "op": "topk", "gpu": "NVIDIA H200", "git_sha": "0123456789abcdef", "date": "2026-12-03", "torch": "2.11.0",
        "triton": "3.6.0", "cuda": "13.0", "nvcc": "release 13.0, V13.0.88", "methods": topk.METHODS,
        "shapes": {"cap": "max(length, 65536)"}, "rows": SYNTHETIC, "target_results": topk.evaluate_targets(SYNTHETIC),
        "sglang_jit": {"nvcc": "release 13.0, V13.0.88", "tvm_ffi": "0.1.11", "v1": {"built": True, "build_s": 9.9},
                       "v2": {"error": "RuntimeError: Failed to build JIT module\nnvcc fatal"}},
        "sglang_published": topk.SGLANG_PUBLISHED,
    }  # fmt: skip


def test_section_renders_a_synthetic_json():
    md = report_topk.topk_section(_synthetic_json())
    assert md.startswith(report_topk.TITLE)
    assert "**k = 512**" in md and "**k = 2048**" in md
    assert "| 64 | 4096 | 8.0 / 4.0 | 9.0 / 12.0 |" in md  # native and sm_89 split side by side, both methods
    assert "30.0 / 15.0 ≠" in md  # the inexact row is marked
    assert "err" in md  # sglang v1 at k = 2048
    assert "| k512_B64_16k | native | graph | 25.0 | sparsemla_split |" in md and "**fail**" in md
    assert "v2 not built: `RuntimeError: Failed to build JIT module`" in md and "13 µs at 4096" in md
    assert "Logits + top-k at length 4k" in md and "7.0 / 3.5" in md
    for name in topk.METHODS:
        assert f"- `{name}`:" in md


def test_section_names_the_triton38_column_and_where_its_code_came_from():
    data = _synthetic_json()
    assert "Triton 3.8" not in report_topk.topk_section(data)  # no such rows: no column, no note
    data["rows"] = [*SYNTHETIC, _row(topk.T38, 64, 4096, 512, 6.0)]
    data["triton38_cubins"] = {"dir": ".gpu-cubins/topk", "triton": ["3.8.0"], "targets": ["cuda:90"]}
    md = report_topk.topk_section(data)
    assert "ours split, Triton 3.8 (native)" in md and "| 64 | 4096 | 8.0 / 4.0 | 9.0 / 12.0 | 6.0 / 3.0 |" in md
    assert "compiled by Triton 3.8.0 (production's) for cuda:90" in md and "every other column is Triton 3.6.0" in md


def test_report_renders_the_newest_json(tmp_path):
    """The measured JSON is committed, so top-k is a regular section: rendered from the newest topk-*.json, and a
    results folder without one has no top-k section at all."""
    assert "topk" in report.SECTIONS and "topk" not in report.PENDING
    assert report_topk.TITLE not in report.render(tmp_path)
    (tmp_path / "topk-h200-2026-12-03.json").write_text(json.dumps(_synthetic_json()))
    page = report.render(tmp_path)
    assert report_topk.TITLE in page
    assert "Not measured yet" not in page and "Source: `" in page and "topk-h200-2026-12-03.json" in page


def _path_json(path: str, **kw) -> dict:
    rows = (
        [r for r in SYNTHETIC if r["path"] == path] if path == "sm89" else [r for r in SYNTHETIC if r["path"] != "sm89"]
    )
    shapes = {"B": [64], "lengths": [4096] if path == "sm89" else [4096, 16384, 65536], "k": [512, 2048]}
    sgl = {"status": "not requested"} if path == "sm89" else _synthetic_json()["sglang_jit"]
    return {**_synthetic_json(), "code_paths": [path], "shapes": shapes, "rows": rows, "sglang_jit": sgl, **kw}


def test_merge_joins_per_path_runs_and_evaluates_targets_over_all_rows(tmp_path):
    """Runs made path by path (one device call each) join into one JSON: rows of both, shapes per path, sglang's
    build report kept, and the sm_89 path's verdicts compared with the native run's torch.topk rows."""
    files = []
    for path in ("native", "sm89"):
        files.append(tmp_path / f"{path}.json")
        files[-1].write_text(json.dumps(_path_json(path, warm_up={path: {"workers": 8, "s": 40.0 + len(path)}})))
    result = CliRunner().invoke(topk.app, ["--out-dir", str(tmp_path / "out"), "--merge", str(files[0]), "--merge",
                                           str(files[1])])  # fmt: skip
    assert result.exit_code == 0, result.output
    (written,) = (tmp_path / "out").glob("topk-*.json")
    data = json.loads(written.read_text())
    assert data["code_paths"] == ["native", "sm89"] and len(data["rows"]) == len(SYNTHETIC)
    assert data["shapes"]["sm89"]["lengths"] == [4096] and data["sglang_jit"]["v1"]["built"] is True
    assert data["warm_up"] == {"native": {"workers": 8, "s": 46.0}, "sm89": {"workers": 8, "s": 44.0}}
    v = _verdict(data["target_results"], "k512_B64_4k", path="sm89")
    assert v["measured_us"] == 9.0 and v["conditions"][1]["ref_us"] == 20.0 and v["pass"] is True
    assert "Measured path by path" in report_topk.topk_section(data)


@pytest.mark.parametrize("bad", ["same-path", "other-commit"])
def test_merge_refuses_runs_that_do_not_belong_together(tmp_path, bad):
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(_path_json("native")))
    other = _path_json("native") if bad == "same-path" else _path_json("sm89", git_sha="fedcba9876543210")
    b.write_text(json.dumps(other))
    result = CliRunner().invoke(topk.app, ["--out-dir", str(tmp_path / "out"), "--merge", str(a), "--merge", str(b)])
    assert result.exit_code == 2
    assert ("repeat a code path" if bad == "same-path" else "different git_sha") in result.output
    assert not (tmp_path / "out").exists()


def test_a_run_without_sglangs_jit_points_to_the_newest_run_that_timed_it(tmp_path):
    """No silent gap: when the JIT top-k did not build, the section names the newest committed run (results/bench or
    explore/) whose JSON timed it next to ours, with that run's v2 times; with none it says so."""
    assert report_topk._last_jit_run(tmp_path) == "No committed run has timed it."
    rows = [dict(path="native", provider="sglang_jit_v2", B=64, k=2048, length=n, us_graph20=us)
            for n, us in ((16384, 7.25), (4096, 3.5))]  # fmt: skip
    old = {**_synthetic_json(), "git_sha": "abc1234", "date": "2026-12-01", "rows": rows,
           "sglang_jit": {"v1": {"built": True}, "v2": {"built": True, "build_s": 50.0}}}  # fmt: skip
    (tmp_path / "explore").mkdir()
    (tmp_path / "explore" / "topk-abc1234-h200-2026-12-01.json").write_text(json.dumps(old))
    (tmp_path / "topk-h200-2026-12-03.json").write_text(json.dumps(_synthetic_json()))  # v2 failed: not a candidate
    line = report_topk._last_jit_run(tmp_path)
    assert "explore/topk-abc1234-h200-2026-12-01.json" in line and "`abc1234`" in line
    assert "v2, k = 2048, B = 64: 3.5 / 7.2 µs graph20 at 4k / 16k" in line  # sorted by length
