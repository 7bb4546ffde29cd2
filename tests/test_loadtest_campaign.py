"""A campaign's pieces without a server: steps between variants, words for cells without a number, kernel shares
before/after, the campaign report, panel windows that reach a snapshot, the sweep lines, and what the reports say
against sglang's fallback and sglang's fast path from the calibration the simulator reported."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import pytest

from sparsemla import variant
from sparsemla.loadtest import display, report_cells
from sparsemla.loadtest.campaign import (
    CampaignError,
    CampaignResult,
    StepResult,
    VariantResult,
    parse_variants,
    plan_steps,
    slug,
    variant_env,
)
from sparsemla.loadtest.kernel_shares import KernelComparison, ProfileSnapshot
from sparsemla.loadtest.report import Run, compare_runs, table_rows, write_report
from sparsemla.loadtest.report_campaign import glance_rows, write_campaign_report
from sparsemla.loadtest.report_panels import PanelImage, PanelRenders, PanelWindow, windows_for
from sparsemla.ops.demo import DEFAULT_VARIANTS
from sparsemla.ops.sim import gpus

BARE = ("–", "missing", "nan", "None")  # what a cell must never be (or contain)


# -- steps ----------------------------------------------------------------------------------------------------------
def test_the_default_campaign_turns_on_one_kernel_per_step() -> None:
    steps = plan_steps(DEFAULT_VARIANTS)
    assert [(s.a, s.b, s.flag) for s in steps] == [
        ("baseline", "mma_decode", "SPARSEMLA_MMA_DECODE"),
        ("mma_decode", "mma_decode+triton_indexer", "SPARSEMLA_TRITON_INDEXER"),
    ]
    assert [s.slug for s in steps] == ["1-sparsemla_mma_decode", "2-sparsemla_triton_indexer"]
    assert parse_variants("baseline, triton_indexer mma_decode+triton_indexer") == [
        "baseline", "triton_indexer", "mma_decode+triton_indexer",
    ]  # fmt: skip
    assert variant_env("mma_decode") == {"SPARSEMLA_MMA_DECODE": "1", "SPARSEMLA_TRITON_INDEXER": "0"}
    assert variant_env("baseline") == {"SPARSEMLA_MMA_DECODE": "0", "SPARSEMLA_TRITON_INDEXER": "0"}
    assert slug("mma_decode+triton_indexer") == "mma_decode_and_triton_indexer"


@pytest.mark.parametrize(
    "variants",
    [["baseline"], ["baseline", "mma_decode+triton_indexer"], ["mma_decode", "baseline"],
     ["mma_decode", "triton_indexer"]],
    ids=["one", "two-at-once", "turns-off", "swaps"],
)  # fmt: skip
def test_a_step_that_is_not_one_kernel_turned_on_is_refused(variants: list[str]) -> None:
    with pytest.raises(CampaignError):
        plan_steps(variants)


def test_an_unknown_variant_is_refused() -> None:
    with pytest.raises(CampaignError, match="unknown variant"):
        parse_variants("baseline mma")


# -- cells without a number -----------------------------------------------------------------------------------------
def _summary(c: int, variant: str, tok: float, *, ttft: float | None, goodput: float | None, sent: int = 40,
             itl: float = 0.03, flag: str = "off", start: float = 1000.0) -> dict[str, Any]:  # fmt: skip
    """A point summary with the fields the report and the reasons read (12-token requests, 12 s window)."""
    return {
        "concurrency": c, "run_id": variant, "variant": variant, "workload": "random:64:12",
        "config": {"max_tokens": 0}, "server_flags": {"sparsemla_mma_decode": flag, "variant": variant},
        "duration_s": 12.0, "requests_started_in_window": sent, "output_tokens": tok * 12, "output_tok_per_s": tok,
        "ttft_s": {"p50": ttft, "p99": ttft}, "itl_s": {"p50": itl, "p99": itl}, "goodput": {"share": goodput},
        "ci95": {}, "test_start": start, "window": {"start": start + 2, "end": start + 14}, "failures": {"total": 0},
    }  # fmt: skip


def _runs(tmp_path: Path) -> tuple[Run, Run]:
    """A: flags off, whose C=64 point sent nothing in its window (2.23 s per token); B: the flag on."""
    a = Run("a", tmp_path / "a", {
        16: [_summary(16, "baseline", 30.0, ttft=0.07, goodput=0.0, itl=0.584)],
        64: [_summary(64, "baseline", 31.8, ttft=None, goodput=None, sent=0, itl=2.23)],
    })  # fmt: skip
    b = Run("b", tmp_path / "b", {
        16: [_summary(16, "mma_decode", 105.0, ttft=0.08, goodput=1.0, itl=0.16, flag="on", start=1100.0)],
        64: [_summary(64, "mma_decode", 128.0, ttft=0.2, goodput=0.0, itl=0.54, flag="on", start=1100.0)],
    })  # fmt: skip
    return a, b


def test_a_point_without_a_value_says_why(tmp_path: Path) -> None:
    a, _ = _runs(tmp_path)
    why = report_cells.no_value_reason("ttft_p50", a.points[64])
    assert why == (
        "none: no request sent in the 12 s window, all users still in their first "
        "(one takes ~26.8 s: 12 tokens × 2.23 s ITL)"
    )
    busy = _summary(64, "baseline", 31.8, ttft=None, goodput=None, sent=64, itl=2.23)
    assert report_cells.no_value_reason("goodput", [busy]).startswith("none: none of the 64 requests sent in the 12 s")
    silent = {**busy, "output_tokens": 0}
    assert report_cells.no_value_reason("itl_p50", [silent]) == "none: no token arrived in the 12 s window"
    assert report_cells.no_value_reason("itl_p50", [busy]) == "none: no request got two tokens within the 12 s window"
    sharegpt = {**a.points[64][0], "workload": "sharegpt:/x.json"}
    assert "one takes" not in report_cells.no_value_reason("ttft_p50", [sharegpt])  # no single output length


def test_no_table_cell_is_a_bare_dash(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    rows = compare_runs(a, b)
    cells = table_rows(rows)
    assert all(cell and not any(bad in cell for bad in BARE) for line in cells for cell in line), cells
    ttft = next(r for r in rows if r.concurrency == 64 and r.metric.key == "ttft_p50")
    assert ttft.a_note.startswith("none: no request sent") and ttft.b_note == ""
    assert ttft.verdict == "not compared: A has no value"
    line = next(c for c in cells if c[0] == "64" and c[1] == "TTFT p50")
    assert line[2] == ttft.a_note and line[4] == "not computed: A without value"
    goodput = next(r for r in rows if r.concurrency == 16 and r.metric.key == "goodput")
    assert goodput.verdict == "no CI (single sample)"  # no stored CI: nothing is called
    assert next(c for c in cells if c[0] == "16" and c[1] == "Goodput")[4] == "undefined: A is 0"


def test_the_written_report_has_no_bare_cell(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    files = write_report(a, b, compare_runs(a, b), tmp_path / "report")
    table = [line for line in files["md"].read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 13  # header + 2 points x 6 metrics
    assert not [line for line in table if any(bad in line for bad in BARE)], table
    assert "none: no request sent in the 12 s window" in files["html"].read_text()
    rows = json.loads((tmp_path / "report" / "compare.json").read_text())["rows"]
    assert rows[0]["cells"][1] == "Output tok/s"


def test_a_goodput_from_zero_is_a_change_in_points() -> None:
    from sparsemla.loadtest import stats
    from sparsemla.loadtest.report import METRICS, verdict

    text, significant = verdict(METRICS[5], stats.Estimate(0.0, 0.0, 0.1, 30, "wilson"),
                                stats.Estimate(1.0, 0.9, 1.0, 30, "wilson"))  # fmt: skip
    assert significant and text == "B better (+100.0 points)"
    assert report_cells.ratio_text(0.0, 1.0) == "undefined: A is 0"
    assert report_cells.ratio_text(2.0, 0.0) == "0 (B is 0)"
    assert report_cells.ratio_text(math.nan, 1.0) == "not computed: A without value"
    assert report_cells.ratio_text(1.0, 2.0) is None


# -- kernel shares --------------------------------------------------------------------------------------------------
def _snapshot(variant: str, total_us: float, kernels: list[tuple[str, str, float]]) -> ProfileSnapshot:
    cats: dict[str, float] = {}
    for _, category, share in kernels:
        cats[category] = cats.get(category, 0.0) + share
    rows = [{"name": n, "category": c, "time_us": s * total_us, "calls": 10, "share": s} for n, c, s in kernels]
    summary = {"total_gpu_us": total_us, "categories": cats, "kernels": rows}
    snap = {"profile_id": f"sparsemla-{variant}", "variant": variant, "outcome": "ok", "started_at": 5000.0,
            "duration_s": 6.0, "summary": summary}  # fmt: skip
    return ProfileSnapshot(variant, 16, snap)


BEFORE = _snapshot(
    "baseline", 5.0e6,
    [("_tiled_sparse_decode_kernel", "attention", 0.725), ("at::native::elementwise_kernel", "elementwise", 0.2),
     ("nvjet_gemm", "gemm", 0.05), ("other", "copy", 0.025)],
)  # fmt: skip
AFTER = _snapshot(
    "mma_decode", 0.5e6,
    [("at::native::elementwise_kernel", "elementwise", 0.6), ("nvjet_gemm", "gemm", 0.35),
     ("_mma_sparse_decode", "attention", 0.05)],
)  # fmt: skip


def test_kernel_shares_before_and_after() -> None:
    kc = KernelComparison(BEFORE, AFTER)
    cats = kc.category_rows()
    assert cats[0] == ["attention", "72.5 % (3.62 s)", "5.0 % (25 ms)", "−67.5 points"]
    assert [r[0] for r in cats] == ["attention", "elementwise", "gemm", "copy"]
    kernels = {r[0]: r for r in kc.kernel_rows()}
    assert kernels["_tiled_sparse_decode_kernel"][3] == "< 5.0 % (not in B's top 3)"
    assert kernels["_mma_sparse_decode"][2] == "< 5.0 % (not in A's top 3)"
    assert kernels["all other kernel groups"][2] == "2.5 % (125 ms)"  # A's `other` row is not a kernel group
    assert kc.headline() == "attention 72.5 % → 5.0 %, elementwise 20.0 % → 60.0 %"
    md = "\n".join(kc.markdown(3))
    assert md.startswith("### Kernel shares") and "| attention | 72.5 % (3.62 s) |" in md
    assert BEFORE.taken_at == 5006.0


def test_a_missing_snapshot_is_said_in_words() -> None:
    failed = ProfileSnapshot("mma_decode", 16, {"outcome": "timeout", "error": "no trace after 120s"})
    kc = KernelComparison(BEFORE, failed)
    assert kc.category_rows() == [] and kc.kernel_rows() == [] and failed.taken_at is None
    assert kc.headline() == "no kernel-share snapshot of mma_decode: no trace after 120s"
    assert "No before/after table: no kernel-share snapshot of mma_decode" in "\n".join(kc.markdown())
    none = ProfileSnapshot("baseline", 16, error="no kernel-share exporter was running")
    assert "exporter was running" in KernelComparison(none, AFTER).html()


# -- the campaign report --------------------------------------------------------------------------------------------
def test_the_campaign_report_shows_every_step(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    runs = {"baseline": a, "mma_decode": b}
    (step,) = plan_steps(list(runs))
    out = tmp_path / "campaign"
    kernels = KernelComparison(BEFORE, AFTER)
    rows = compare_runs(a, b)
    files = write_report(a, b, rows, out / "steps" / step.slug, title=step.title, kernels=kernels)
    tags = ["ab", "variant=mma_decode", "flag=SPARSEMLA_MMA_DECODE"]
    flips = [{"time": 5_000_000, "timeEnd": 5_004_000, "tags": tags, "text": "SPARSEMLA_MMA_DECODE=1 (on): restarted"}]
    result = CampaignResult(
        out, [16, 64],
        {"baseline": VariantResult("baseline", a, BEFORE), "mma_decode": VariantResult("mma_decode", b, AFTER, flips)},
        [StepResult(step, rows, files, kernels)],
    )  # fmt: skip
    headers, glance = glance_rows(result)
    assert headers == ["C", "baseline tok/s", "mma_decode tok/s", "step 1 B/A"]
    assert glance[1] == ["64", "31.8", "128.0", "× 4.025"]
    written = write_campaign_report(result, title="campaign", notes=["a check"])
    md = written["md"].read_text()
    assert "## Step 1: SPARSEMLA_MMA_DECODE" in md and "### Kernel shares" in md and "- a check" in md
    assert "(steps/1-sparsemla_mma_decode/throughput_vs_concurrency.png)" in md
    assert "| 01:23:20 | SPARSEMLA_MMA_DECODE=1 | mma_decode | 4.0 s |" in md
    assert "The target was started serving baseline" in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert not [line for line in table if any(bad in line for bad in BARE)]
    data = json.loads(written["json"].read_text())
    assert data["steps"][0]["kernels"]["headline"].startswith("attention 72.5 %")
    assert data["variants"]["mma_decode"]["flips"] == flips


# -- panels ---------------------------------------------------------------------------------------------------------
def test_the_panel_window_reaches_the_last_snapshot(tmp_path: Path) -> None:
    a, b = _runs(tmp_path)
    assert windows_for(a, b) == [("A and B", 985.0, 1129.0)]
    assert windows_for(a, b, until=1200.0) == [("A and B", 985.0, 1215.0)]
    assert windows_for(a, b, until=1000.0) == [("A and B", 985.0, 1129.0)]  # never shortened


def test_panel_renders_round_trip_and_gpu_panels_are_labelled(tmp_path: Path) -> None:
    from sparsemla.loadtest.report import _panels_md

    images = [PanelImage("Tensor core activity", "panels/x/1.png", False, "gpu"),
              PanelImage("Kernel share A − B", "panels/x/2.png", False)]  # fmt: skip
    renders = PanelRenders("http://p", [PanelWindow("A and B", 1.0, 2.0, images)], None, {"variant": ["a"]})
    again = PanelRenders.from_json(json.loads(json.dumps(renders.to_json())))
    assert again.images() == images and again.variables == {"variant": ["a"]}
    md = "\n".join(_panels_md(again, prefix="steps/1/", level=3))
    assert "(steps/1/panels/x/1.png) (no data: GPU profile only)" in md
    assert "(steps/1/panels/x/2.png) (no data)" in md and md.startswith("### Dashboard panels")


def test_sweep_lines_say_none_with_the_reason(tmp_path: Path) -> None:
    a, _ = _runs(tmp_path)
    summaries = [{**s, "repeat": 1} for group in a.points.values() for s in group]
    with display.console.capture() as captured:
        display.print_sweep(summaries)
    c16, c64 = (" ".join(part.split()) for part in captured.get().split("C=")[1:])  # one line per point, unwrapped
    assert "TTFT p50 70.0 ms" in c16 and "(" not in c16
    assert "TTFT p50 none ITL p50 2230.0 ms" in c64 and "(no request sent in the 12 s window" in c64


# -- vs sglang's fallback and vs sglang's fast path, from the calibration /server_info reported ------------------------
def _simulated(run: Run, gpu: str | None, *, drop_references: bool = False) -> Run:
    """``run`` as if its points had run against `sparsemla sim --gpu GPU`: each summary carries the server's
    ``/server_info`` calibration summary (what the load test records; ``drop_references``: an older simulator's)."""
    from sparsemla.ops.sim.calibration import load_calibration

    cal = load_calibration(gpu=gpu).summary() if gpu else None
    if cal is not None and drop_references:
        cal.pop("references")
    server = {"sparsemla": {"calibration": cal}} if cal is not None else {"version": "0.5.23"}
    points = {c: [{**s, "server": json.loads(json.dumps(server))} for s in group] for c, group in run.points.items()}
    return Run(run.name, run.path, points)


def test_the_fast_path_goal_is_the_step_reports() -> None:
    from benchmarks import step_report
    from sparsemla.loadtest.calibration_label import FAST_PATH_GOALS

    assert FAST_PATH_GOALS == step_report.FAST_PATH_GOALS


def test_the_ab_report_compares_with_sglangs_fast_path_from_the_calibration(tmp_path: Path) -> None:
    from sparsemla.loadtest.calibration_label import FAST_PATH_GOALS
    from sparsemla.ops.sim.calibration import load_calibration

    ref_name = "flashmla_decode+triton_indexer"
    ref = load_calibration(gpu="h200").references[ref_name]
    (goal_b, want), = FAST_PATH_GOALS.items()  # fmt: skip
    (c0, x0), (c1, x1) = ref.speedups_at(goal_b)
    a, b = (_simulated(r, "h200") for r in _runs(tmp_path))
    files = write_report(a, b, compare_runs(a, b), tmp_path / "report")
    md, page = files["md"].read_text(), files["html"].read_text()
    fast = f"flags on (`{variant.ALL_ON}`) are {x0:.2f}x as fast per step at B={goal_b}, {c0 // 1024}k context "
    fast += f"({x1:.2f}x at {c1 // 1024}k context); goal >= {want}x at B={goal_b}: "
    fast += "met" if min(x0, x1) >= want else "missed"
    assert md.count(fast) == 1 and html.escape(fast) in page
    assert f"- vs sglang's fast path on the NVIDIA H200 (`{ref_name}`: {ref.description}; measured in the " in md
    assert "not served by the simulator" in md
    values = [x for row in ref.flags_on_speedup.values() for x in row.values()]
    assert f"{min(values):.2f}-{max(values):.2f}x over its {len(values)} measured points" in md
    over = load_calibration(gpu="h200").flags_on_speedup()  # flags on vs sglang's fallback, per step
    fallback = (
        f"- vs sglang's fallback on the NVIDIA H200 (flags off, `baseline`: {gpus.BASELINES['h200'].label}): flags on "
        f"(`{variant.ALL_ON}`) are {over[c0][goal_b]:.1f}x as fast per step at B={goal_b}, {c0 // 1024}k context "
        f"({over[c1][goal_b]:.1f}x at {c1 // 1024}k context) in the measured calibration."
    )
    assert fallback in md and md.index(fallback) < md.index("- vs sglang's fast path")


@pytest.mark.parametrize("gpu", ["rtx-pro-6000", "l40s", "a100"])
def test_a_projected_calibration_says_why_there_is_no_fast_path(tmp_path: Path, gpu: str) -> None:
    a, b = (_simulated(r, gpu) for r in _runs(tmp_path))
    md = write_report(a, b, compare_runs(a, b), tmp_path / "report")["md"].read_text()
    (line,) = [x for x in md.splitlines() if x.startswith("- vs sglang's fast path")]
    assert line == (
        f"- vs sglang's fast path on the {gpus.GPUS[gpu].name}: not measured (reference state "
        f"`flashmla_decode+triton_indexer`): {gpus.FAST_PATH_NOT_MEASURED[gpu]}; the speed-ups here are over sglang's "
        "fallback only."
    )
    assert not any(bad in line for bad in BARE)


def test_no_fast_path_line_for_a_real_server_and_words_for_an_older_simulator(tmp_path: Path) -> None:
    a, b = (_simulated(r, None) for r in _runs(tmp_path))
    md = write_report(a, b, compare_runs(a, b), tmp_path / "real")["md"].read_text()
    assert "vs sglang's" not in md
    a, b = (_simulated(r, "h200", drop_references=True) for r in _runs(tmp_path))
    md = write_report(a, b, compare_runs(a, b), tmp_path / "old")["md"].read_text()
    assert "- vs sglang's fast path: not reported (the simulator's NVIDIA H200 calibration summary has no " in md


def test_the_campaign_report_says_it_once_above_the_steps(tmp_path: Path) -> None:
    a, b = (_simulated(r, "h200") for r in _runs(tmp_path))
    runs = {"baseline": a, "mma_decode": b}
    (step,) = plan_steps(list(runs))
    out = tmp_path / "campaign"
    rows = compare_runs(a, b)
    files = write_report(a, b, rows, out / "steps" / step.slug, title=step.title)
    assert "vs sglang's fast path" in files["md"].read_text()  # the step's own report has it
    result = CampaignResult(
        out, [16, 64],
        {"baseline": VariantResult("baseline", a, BEFORE), "mma_decode": VariantResult("mma_decode", b, AFTER)},
        [StepResult(step, rows, files, KernelComparison(BEFORE, AFTER))],
    )  # fmt: skip
    written = write_campaign_report(result, title="campaign")
    md, page = written["md"].read_text(), written["html"].read_text()
    assert md.count("- vs sglang's fast path on the NVIDIA H200") == 1 and md.count("vs sglang's fallback") == 1
    assert md.index("vs sglang's fast path") < md.index("## Where the GPU time moved")
    assert page.count("vs sglang&#x27;s fast path on the NVIDIA H200") == 1
    data = json.loads(written["json"].read_text())
    assert data["comparison"] == [line[2:] for line in md.splitlines() if line.startswith("- vs sglang's")]
