"""The DeepSeek-V3.2 decode benchmark without a GPU: its CLI validates before touching CUDA, the shape grid and the
floor arithmetic, the inputs (built on the CPU), FlashMLA's argument conventions (against a CPU stand-in that
computes FlashMLA's documented outputs with our reference), the ratios and target verdict from rows, and the
docs/performance.md section rendered from a synthetic JSON (an input to the renderer, not a result)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import decode_v32 as bench
from benchmarks import report, report_decode_v32
from sparsemla.kernels import layouts
from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

# -- options and grid --------------------------------------------------------------------------------------------------


def test_default_grid_is_the_issues_shapes():
    shapes = bench.shape_grid(*bench.DEFAULTS.values(), topk=2048, ctx=8192)
    assert len(shapes) == 2 * 2 * 5  # formats x H x B, s_q 1
    assert {(s.B, s.H, s.kv_format) for s in shapes} == {
        (b, h, f) for b in (1, 8, 32, 64, 128) for h in (16, 128) for f in ("fp8_656", "bf16_576")
    }
    assert {(s.s_q, s.topk, s.ctx) for s in shapes} == {(1, 2048, 8192)}
    assert [s.kv_format for s in shapes[:10]] == ["fp8_656"] * 10  # format-major, then s_q, H, B
    assert [s.B for s in shapes[:5]] == [1, 8, 32, 64, 128] and shapes[0].H == 16


def test_grid_takes_mtp_and_one_format():
    shapes = bench.shape_grid("4,4", "128", "1,2", "bf16_576", topk=512, ctx=512)
    assert [(s.B, s.s_q, s.H, s.kv_format) for s in shapes] == [(4, 1, 128, "bf16_576"), (4, 2, 128, "bf16_576")]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("1", "16", "1", "fp8_656", 2000, 8192), "multiple of 64"),
        (("1", "16", "1", "fp8_656", 2048, 1024), "--ctx"),
        (("1", "16", "3", "fp8_656", 2048, 8192), "--s-q"),
        (("1", "16", "1", "fp8", 2048, 8192), "fp8_656, bf16_576"),
        (("0", "16", "1", "fp8_656", 2048, 8192), "--batches"),
        (("1", "x", "1", "fp8_656", 2048, 8192), "--heads"),
    ],
)
def test_grid_rejects_bad_options(args, needle):
    with pytest.raises(ValueError, match=needle):
        bench.shape_grid(*args)


def test_provider_names_are_checked():
    assert bench.parse_names("flashmla, sparsemla,flashmla", "providers", bench.PROVIDERS) == ["flashmla", "sparsemla"]
    with pytest.raises(ValueError, match="sglang_triton"):
        bench.parse_names("sparsemla,sglang_triton", "providers", bench.PROVIDERS)


@pytest.mark.parametrize(
    "args", [["--s-q", "3"], ["--formats", "bf16"], ["--providers", "bogus"], ["--paths", "ampere"], ["--ctx", "64"]]
)
def test_cli_rejects_bad_options_before_cuda(args):
    result = CliRunner().invoke(bench.app, args)
    assert result.exit_code == 2
    assert "needs a CUDA GPU" not in result.output


def test_cli_lists_its_options():
    result = CliRunner().invoke(bench.app, ["--help"])
    assert result.exit_code == 0
    for opt in ("--batches", "--heads", "--topk", "--s-q", "--formats", "--providers", "--paths", "--ctx",
                "--out-dir", "--git-sha"):  # fmt: skip
        assert opt in result.output


# -- floor -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kv_format", "row_bytes"), [("fp8_656", 656), ("bf16_576", 1152)])
def test_floor_counts_each_gathered_row_once_per_query_row(kv_format, row_bytes):
    shape = bench.Shape(B=8, s_q=2, H=16, topk=2048, kv_format=kv_format, ctx=8192)
    ceilings = {"copy_bytes_per_s": 4e12, "bf16_flops_per_s": 6e14}
    rows = 8 * 2
    nbytes = rows * 2048 * (row_bytes + 4) + rows * 16 * (576 * 2 + 512 * 2 + 4)  # kv + index; q, out, lse per head
    flops = 2 * rows * 16 * 2048 * (576 + 512)
    fl, t_mem, t_mma = bench.floor_us(shape, ceilings)
    assert t_mem == pytest.approx(nbytes / 4e12 * 1e6)
    assert t_mma == pytest.approx(flops / 6e14 * 1e6)
    assert fl == max(t_mem, t_mma)
    # heads share the gathered rows: 8x the heads add only the q / out bytes
    more = bench.floor_us(bench.Shape(8, 2, 128, 2048, kv_format, 8192), ceilings)[1]
    assert more - t_mem == pytest.approx(rows * 112 * (576 * 2 + 512 * 2 + 4) / 4e12 * 1e6)


def test_flashmla_head_padding():
    assert [bench.flashmla_pad_heads(h) for h in (1, 16, 64, 65, 128)] == [64, 64, 64, 128, 128]


# -- inputs ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_inputs_are_distinct_slots_of_each_requests_own_pages(kv_format):
    shape = bench.Shape(B=3, s_q=2, H=4, topk=64, kv_format=kv_format, ctx=200)  # ctx not a page multiple
    kw = bench.make_inputs(shape, seed=1, device="cpu")
    pages = -(-200 // 64)
    assert kw["q"].shape == (3, 2, 4, 576) and kw["q"].dtype == torch.bfloat16
    assert kw["kv_cache"].shape == (3 * pages, 64, 1, layouts.v32_row_width(kv_format))
    assert kw["kv_cache"].dtype == (torch.uint8 if kv_format == "fp8_656" else torch.bfloat16)
    assert kw["indices"].shape == (3, 2, 64) and kw["indices"].dtype == torch.int32
    table = kw["block_table"]
    assert sorted(table.flatten().tolist()) == list(range(3 * pages))  # every page owned by one request
    for b in range(3):
        own = table[b].tolist()
        for s in range(2):
            idx = kw["indices"][b, s]
            assert len(set(idx.tolist())) == 64  # distinct
            pos = torch.tensor([own.index(p) for p in (idx // 64).tolist()]) * 64 + idx % 64
            assert int(pos.max()) < 200  # within the request's ctx slots
    rows = layouts.decode_v32_rows(kw["kv_cache"], kw["indices"], kv_format)
    assert torch.isfinite(rows).all() and (rows != 0).any()
    nope_std = rows[..., :512].reshape(-1, 4, 128).std(dim=(0, 2))
    assert (nope_std[2] > 3 * nope_std[1] > 3 * nope_std[0]).item()  # the tiles' scales differ (0.5, 2, 8)
    again = bench.make_inputs(shape, seed=1, device="cpu")
    assert torch.equal(again["indices"], kw["indices"]) and torch.equal(again["kv_cache"], kw["kv_cache"])


@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_ours_on_the_inputs_matches_the_reference(nan_empty, kv_format):
    """Our call as timed, on the CPU interpreter at a tiny shape (both s_q rows their own index set)."""
    shape = bench.Shape(B=2, s_q=2, H=3, topk=64, kv_format=kv_format, ctx=128)
    kw = bench.make_inputs(shape, seed=3, device="cpu")
    run, unpack = bench.ours_call(kw)
    out, lse = unpack(run())
    want_out, want_lse = bench.reference_call(kw)[0]()
    assert bench.rel_err(out, want_out) < 1e-2
    assert bench.lse_err(lse, want_lse) < 1e-3


# -- FlashMLA's conventions --------------------------------------------------------------------------------------------


@dataclass
class _SchedMeta:  # FlashMLASchedMeta's fields sglang's wrapper sets
    tile_scheduler_metadata: Any = None
    num_splits: Any = None


class _StandIn:
    """CPU stand-in of ``flash_mla``: records every call and returns what FlashMLA's interface documents, computed by
    our reference (decode: out [T, 1, H, 512], natural-log lse [T, H, 1]; sparse_fwd: out [T, H, 512], max_logits,
    base-2 lse [T, H])."""

    flash_mla_interface = SimpleNamespace(FlashMLASchedMeta=_SchedMeta)

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def get_mla_decoding_metadata(self, *args: Any, **kwargs: Any):
        self.calls.append(("get_mla_decoding_metadata", args, kwargs))
        return torch.zeros(4, 8, dtype=torch.int32), torch.zeros(args[0].shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(self, **kw: Any):
        self.calls.append(("flash_mla_with_kvcache", (), kw))
        out, lse = sparse_decode_v32_reference(
            kw["q"], kw["k_cache"], kw["indices"], kw["softmax_scale"], kv_format="fp8_656"
        )
        return out, lse

    def flash_mla_sparse_fwd(self, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, **kw: Any):
        self.calls.append(("flash_mla_sparse_fwd", (q, kv, indices, sm_scale, d_v, attn_sink, topk_length), kw))
        cache = kv.view(-1, 1, 1, kv.shape[-1])  # flat slots: page size 1
        out, lse = sparse_decode_v32_reference(q.unsqueeze(1), cache, indices, sm_scale, kv_format="bf16_576")
        return out[:, 0], None, lse[:, :, 0] / math.log(2.0)


def test_flashmla_decode_call_is_sglangs_flashmla_kv_call():
    shape = bench.Shape(B=2, s_q=2, H=4, topk=64, kv_format="fp8_656", ctx=128)
    kw = bench.make_inputs(shape, seed=5, device="cpu")
    fm = _StandIn()
    run, unpack = bench.flashmla_decode_call(fm, kw)
    (name, args, kwargs), = fm.calls  # fmt: skip
    assert name == "get_mla_decoding_metadata"  # the schedule: once, before any timed call
    assert args[0].tolist() == [64] * 4 and args[1:] == (64, 1, 64, True, 64) and kwargs == {"use_legacy": True}
    out, lse = unpack(run())
    assert len(fm.calls) == 2
    call = fm.calls[1][2]
    assert call["q"].shape == (4, 1, 64, 576) and not call["q"][:, :, 4:].any()  # rows = B * s_q, heads padded
    assert torch.equal(call["q"][:, 0, :4], kw["q"].reshape(4, 4, 576))
    assert call["indices"].shape == (4, 1, 64) and call["block_table"].shape == (4, 0)
    assert call["k_cache"] is kw["kv_cache"] and call["cache_seqlens"].tolist() == [64] * 4
    assert (call["is_fp8_kvcache"], call["use_legacy"], call["kv_format"], call["num_splits"]) == (
        True, True, "V32", None,
    )  # fmt: skip
    assert call["tile_scheduler_metadata"].tile_scheduler_metadata is not None
    want_out, want_lse = sparse_decode_v32_reference(kw["q"], kw["kv_cache"], kw["indices"], bench.SM_SCALE,
                                                     kv_format="fp8_656")  # fmt: skip
    assert out.shape == want_out.shape and lse.shape == want_lse.shape == (2, 4, 2)
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)


def test_flashmla_sparse_fwd_call_is_sglangs_flashmla_sparse_call():
    shape = bench.Shape(B=2, s_q=2, H=128, topk=64, kv_format="bf16_576", ctx=128)
    kw = bench.make_inputs(shape, seed=6, device="cpu")
    fm = _StandIn()
    run, unpack = bench.flashmla_sparse_fwd_call(fm, kw)
    out, lse = unpack(run())
    (name, (q, kv, idx, scale, d_v, sink, length), kwargs), = fm.calls  # fmt: skip
    assert name == "flash_mla_sparse_fwd" and q.shape == (4, 128, 576)  # 128 heads: no padding
    assert kv.shape == (2 * 2 * 64, 1, 576) and kv.data_ptr() == kw["kv_cache"].data_ptr()
    assert idx.shape == (4, 1, 64) and (scale, d_v, sink) == (bench.SM_SCALE, 512, None)
    assert length.tolist() == [64] * 4 and kwargs == {"use_legacy": True, "return_log2_lse": True}
    want_out, want_lse = sparse_decode_v32_reference(kw["q"], kw["kv_cache"], kw["indices"], bench.SM_SCALE,
                                                     kv_format="bf16_576")  # fmt: skip
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)  # base 2 back to natural log


# -- ratios, target, report --------------------------------------------------------------------------------------------


def _row(provider: str, b: int, h: int, us: float | None, fmt: str = "fp8_656", path: str = "native", **kw) -> dict:
    row = {"B": b, "s_q": 1, "H": h, "topk": 2048, "kv_format": fmt, "ctx": 8192, "provider": provider}
    return {**row, "code_path": path, **({} if us is None else {"us": us}), **kw}


SYNTHETIC = [
    _row("sparsemla", 1, 16, 30.0), _row("sparsemla_graph", 1, 16, 20.0),
    _row("flashmla", 1, 16, 25.0), _row("flashmla_graph", 1, 16, 18.0),
    _row("sparsemla_sm89path_graph", 1, 16, 27.0, path="sm89"),
    _row("sparsemla_graph", 64, 128, 150.0), _row("flashmla_graph", 64, 128, 100.0),  # 1.5x: over the limit
    _row("sparsemla_graph", 1, 16, 22.0, fmt="bf16_576"),
    _row("flashmla_sparse_fwd_graph", 1, 16, 40.0, fmt="bf16_576"),
    _row("flashmla_sparse_fwd", 8, 16, None, fmt="bf16_576", error="RuntimeError: synthetic"),
]  # fmt: skip


def test_speedups_pair_each_method_with_the_formats_flashmla_kernel():
    speeds = {(s["kv_format"], s["B"], s["provider"]): s for s in bench.speedups(SYNTHETIC)}
    g = speeds[("fp8_656", 1, "sparsemla_graph")]
    assert (g["baseline"], g["method"], g["ratio"], g["speedup"]) == ("flashmla_graph", "graph", 1.111, 0.9)
    assert speeds[("fp8_656", 1, "sparsemla")]["baseline"] == "flashmla"  # eager against eager
    assert speeds[("fp8_656", 1, "sparsemla_sm89path_graph")]["ratio"] == 1.5
    assert speeds[("bf16_576", 1, "sparsemla_graph")]["baseline"] == "flashmla_sparse_fwd_graph"
    assert ("bf16_576", 8, "sparsemla_graph") not in speeds  # error rows have no time


def test_target_verdict_comes_from_the_rows():
    verdicts = {(t["kv_format"], t["provider"]): t for t in bench.evaluate_target(bench.speedups(SYNTHETIC))}
    native = verdicts[("fp8_656", "sparsemla_graph")]
    assert native["pass"] is False and (native["within"], native["points"]) == (1, 2)
    assert native["worst_ratio"] == 1.5 and native["worst_at"] == {"B": 64, "s_q": 1, "H": 128}
    assert verdicts[("bf16_576", "sparsemla_graph")]["pass"] is True
    assert verdicts[("fp8_656", "sparsemla_sm89path_graph")]["pass"] is False
    assert ("fp8_656", "sparsemla") not in verdicts  # the verdict is on graph replay only


def test_floor_rows_one_per_shape():
    floors = bench.floor_rows(SYNTHETIC, {"copy_bytes_per_s": 4e12, "bf16_flops_per_s": 6e14})
    assert len(floors) == 4 and all(f["provider"] == "floor" and f["us"] > 0 for f in floors)
    assert all(f["us"] == max(f["bytes_us"], f["flops_us"]) for f in floors)


def _synthetic_json() -> dict:
    rows = SYNTHETIC + bench.floor_rows(SYNTHETIC, {"copy_bytes_per_s": 4e12, "bf16_flops_per_s": 6e14})
    speeds = bench.speedups(rows)
    return {
        "op": "decode_v32", "gpu": "NVIDIA H200", "git_sha": "0123456789abcdef", "torch": "2.11.0",
        "triton": "3.6.0", "date": "2026-12-03T00:00:00+00:00", "method": "synthetic method",
        "ceilings": {"copy_bytes_per_s": 4e12, "bf16_flops_per_s": 6e14}, "shapes": {"topk": 2048, "ctx": 8192},
        "flashmla": bench.FLASHMLA_NOTES, "baselines": bench.BASELINE, "rows": rows, "speedups": speeds,
        "target_results": bench.evaluate_target(speeds),
        "path_runs": [{"code_path": "native"}, {"code_path": "sm89", "error": "child exited with 1"}],
        "checks": [{"B": 1, "code_path": "native", "rel_err_vs_reference": {"sparsemla": 4e-3, "flashmla": 5e-3},
                    "lse_err_vs_reference": {"sparsemla": 1e-3}, "rel_err_vs_sparsemla": {"flashmla": 6e-3}}],
    }  # fmt: skip


def test_section_renders_a_synthetic_json():
    md = report_decode_v32.decode_v32_section(_synthetic_json())
    assert md.startswith(report_decode_v32.TITLE)
    assert "NVIDIA H200, torch 2.11.0, Triton 3.6.0, commit `0123456789`" in md
    assert "**fp8_656**" in md and "**bf16_576**" in md and "`flashmla_sparse_fwd`" in md
    assert "| 1 | 16 | 1 | 20.0 | 27.0 | 18.0 |" in md  # native graph, sm89 graph, FlashMLA graph
    assert "| 1.11x | 1.50x | 30.0 | 25.0 | - |" in md  # ratios, then the eager times, no reference row
    assert "| 1 | 128 | 64 | 150 | - | 100 |" in md
    assert "`fp8_656` `sparsemla_graph` vs `flashmla_graph`: **missed** (1/2 points within 1.3x; worst 1.50x" in md
    assert "`bf16_576` `sparsemla_graph` vs `flashmla_sparse_fwd_graph`: met" in md
    assert "code path `sm89`: child exited with 1" in md
    assert "`flashmla` (native) 5.0e-03" in md and "has no bf16 sparse decode" in md


def test_section_adds_triton_38_columns_when_the_run_replayed_cubins():
    """A run with --cubins has sparsemla_t38_graph rows: they get their own columns (time and ratio to FlashMLA) and
    their own verdict; a run without them renders the columns of before."""
    data = _synthetic_json()
    rows = data["rows"] + [_row("sparsemla_t38_graph", 1, 16, 16.2), _row("sparsemla_t38_graph", 64, 128, 120.0)]
    speeds = bench.speedups(rows)
    data.update(rows=rows, speedups=speeds, target_results=bench.evaluate_target(speeds))
    md = report_decode_v32.decode_v32_section(data)
    assert "| ours native 3.8 | ours native 3.8 / FlashMLA |" in md
    assert "| 1 | 16 | 1 | 20.0 | 27.0 | 16.2 | 0.90x | 18.0 |" in md
    assert "| 1 | 128 | 64 | 150 | - | 120 | 1.20x | 100 |" in md
    assert "`fp8_656` `sparsemla_t38_graph` vs `flashmla_graph`: met (2/2 points within 1.3x" in md
    assert "ours native 3.8" not in report_decode_v32.decode_v32_section(_synthetic_json())


def test_report_renders_the_op_pending_until_its_json_exists(tmp_path: Path):
    assert "decode_v32" in report.PENDING or "decode_v32" in report.SECTIONS  # PENDING until its JSON is committed
    assert "make bench-decode-v32" in report_decode_v32.pending_section()
    if "decode_v32" in report.PENDING:
        assert report_decode_v32.pending_section() in report.render(tmp_path)
    (tmp_path / "decode_v32-h200-2026-12-03.json").write_text(json.dumps(_synthetic_json()))
    page = report.render(tmp_path)
    assert report_decode_v32.pending_section() not in page
    assert report_decode_v32.TITLE in page and "Source: `" in page
    assert report.newest(tmp_path, "decode") is None  # decode-*.json does not pick up decode_v32-*.json


def test_section_appends_a_newer_follow_up_run_only(tmp_path: Path):
    """A `decode_v32_opaque-*.json` under the explore folder (the same script on a subset, after the formal run) is
    rendered under its own sub-heading when it is newer than the formal JSON, and left out when it is older."""
    data = _synthetic_json()
    explore = tmp_path / "results" / "bench" / "explore"
    explore.mkdir(parents=True)
    assert report_decode_v32.followup_section(data, explore) == ""  # none there
    later = dict(_synthetic_json(), date="9999-01-01", git_sha="fedcba9876")
    (explore / "decode_v32_opaque-h200-9999-01-01.json").write_text(json.dumps(later))
    md = report_decode_v32.decode_v32_section(data, explore)
    assert md.count(report_decode_v32.TITLE) == 1 and "**After the opaque K move**" in md
    assert "`results/bench/explore/decode_v32_opaque-h200-9999-01-01.json`" in md and "commit `fedcba9876`" in md
    older = dict(later, date="2000-01-01")
    (explore / "decode_v32_opaque-h200-9999-01-01.json").write_text(json.dumps(older))
    assert "After the opaque K move" not in report_decode_v32.decode_v32_section(data, explore)
