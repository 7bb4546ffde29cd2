"""The DeepSeek-V3.2 decode-step harness on the CPU: the model's shape and memory arithmetic at the full size, one
whole step at the tiny shape with the fp32 reference ops (every layer indexed), FlashMLA's call conventions against a
CPU stand-in that computes FlashMLA's documented output with our reference, the options, and the JSON from a CPU
smoke run and from synthetic rows (the GPU run itself is `make bench-step-v32`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import step_model_v32 as model
from benchmarks import step_v32 as bench
from sparsemla import flags
from sparsemla.kernels.layouts import V32_DIM, V32_FP8_BYTES, V32_PAGE
from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _reference_kernels():
    """The fp32 references, not Triton's CPU interpreter (conftest turns it on): a whole step per test must be fast."""
    with flags.TRITON_INTERPRET.override(False):
        yield


@dataclass
class FakeSchedMeta:
    tile_scheduler_metadata: Any = None
    num_splits: Any = None


class FakeFlashMLA:
    """sgl-flash-mla's two V3.2 decode entry points on the CPU: the argument conventions sglang's wrapper uses are
    asserted, the output is FlashMLA's documented one (our fp32 reference at the padded head count)."""

    __version__ = "1.0.0+cpu-test"
    flash_mla_interface = SimpleNamespace(FlashMLASchedMeta=FakeSchedMeta)

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def get_mla_decoding_metadata(self, seqlens, num_q_tokens_per_head_k, h_k, h_q, is_fp8_kvcache, topk, *,
                                  use_legacy):  # fmt: skip
        assert h_k == 1 and h_q == num_q_tokens_per_head_k in (64, 128) and is_fp8_kvcache and use_legacy
        self.calls.append({"schedule": seqlens.tolist(), "topk": topk})
        return torch.zeros(1, 8, dtype=torch.int32), torch.zeros(seqlens.shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(self, *, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               softmax_scale, causal, is_fp8_kvcache, indices, use_legacy, kv_format):  # fmt: skip
        B = q.shape[0]
        assert q.shape[1:] in ((1, 64, V32_DIM), (1, 128, V32_DIM)) and q.dtype == torch.bfloat16
        assert tuple(k_cache.shape[1:]) == (V32_PAGE, 1, V32_FP8_BYTES) and k_cache.dtype == torch.uint8
        assert tuple(block_table.shape) == (B, 0) and tuple(cache_seqlens.shape) == (B,)
        assert head_dim_v == 512 and not causal and is_fp8_kvcache and use_legacy and kv_format == "V32"
        assert isinstance(tile_scheduler_metadata, FakeSchedMeta)
        assert tile_scheduler_metadata.tile_scheduler_metadata is not None
        assert indices.dim() == 3 and indices.shape[:2] == (B, 1) and indices.dtype == torch.int32
        self.calls.append({"decode": tuple(q.shape), "pad_rows_zero": bool((q[:, :, 4:] == 0).all())})
        return sparse_decode_v32_reference(q, k_cache, indices, softmax_scale, kv_format="fp8_656")


def tiny_step(state: str, batch: int = 2, ctx: int = 512, flash_mla: Any = None, seed: int = 0):
    shape = model.TINY
    gen = torch.Generator().manual_seed(seed)
    layers, lm_head, norm = model.make_weights(shape, CPU, gen)
    inp = model.make_inputs(shape, batch, ctx, shape.max_context, CPU, torch.Generator().manual_seed(seed + 1))
    return model.DecodeStepV32(shape, layers, lm_head, norm, inp, state, flash_mla), inp


# -- the model at its full size ----------------------------------------------------------------------------------------
def test_v32_shape_layers_and_experts() -> None:
    s = model.V32
    assert len(s.layer_types) == 61 and s.layer_types[:3] == ("dense",) * 3 and s.layer_types.count("moe") == 58
    assert s.indexer_layers == 61  # every layer indexes
    assert (s.local_heads, s.flashmla_heads, s.qk_head_dim, s.local_experts, s.dp) == (128, 128, 192, 32, 8)
    assert s.softmax_scale == pytest.approx(192**-0.5 * (0.1 * torch.tensor(40.0).log().item() + 1) ** 2)
    assert s.active_experts(1) == (8, 1)  # 8 tokens x 8 of 256 experts: 32 * 0.224 -> 8 touched, 8 pairs
    assert s.active_experts(64) == (32, 16)  # 512 tokens touch every local expert, 512 pairs
    tp8 = model.ModelShapeV32.v32(tp=8)
    assert (tp8.local_heads, tp8.flashmla_heads, tp8.dp) == (16, 64, 1)  # sglang pads 16 heads to 64 for FlashMLA
    assert tp8.active_experts(64) == (28, 3)  # one TP group: 64 tokens, 64 pairs on this rank
    for bad in (dict(tp=3), dict(tp=0), dict(ep=6), dict(kv_lora=256)):
        with pytest.raises(ValueError):
            model.ModelShapeV32(**bad)


def test_params_and_memory_estimate_of_the_full_shape() -> None:
    s = model.V32
    params = s.params()
    assert params["total"] == pytest.approx(671e9, rel=0.01)  # DeepSeek-V3.2 is a 671B model (without MTP)
    assert params["routed_experts"] == 58 * 256 * 3 * 7168 * 2048
    mem = model.memory_estimate(s, 64, 32768)
    assert mem["harness_weight_bytes"] == pytest.approx(6.36e9, rel=0.01)  # one dense + one MoE layer + LM head
    assert mem["rank_weight_bytes_bf16"] > 141e9 > mem["rank_weight_bytes_fp8"]  # why the layers share weights
    assert mem["harness_cache_bytes"] == 2 * 64 * 32768 * (656 + 132)
    assert mem["rank_cache_bytes"] == 61 * 64 * 32768 * (656 + 132)
    assert mem["logits_bytes_per_layer"] == 64 * 163840 * 4
    assert model.memory_estimate(s, 1, 4096)["harness_weight_bytes"] == mem["harness_weight_bytes"]


def test_tiny_allocation_matches_the_estimate() -> None:
    shape = model.TINY
    layers, lm_head, _ = model.make_weights(shape, CPU, torch.Generator().manual_seed(0))
    allocated = sum(model.tensor_bytes(w) for w in layers.values()) + lm_head.numel() * lm_head.element_size()
    assert allocated == pytest.approx(model.memory_estimate(shape, 1, 512)["harness_weight_bytes"], rel=0.01)
    lm = lm_head.numel() * lm_head.element_size()
    every_layer = model.tensor_bytes(layers["dense"]) + 3 * model.tensor_bytes(layers["moe"]) + lm
    assert shape.active_experts(64)[0] == shape.local_experts  # a full step streams every local expert
    assert model.weight_bytes(shape, layers, lm_head, 64) == every_layer
    one = replace(shape, experts=64)  # 8 local experts: at B = 1 the 8 ranks' 8 tokens leave some untouched
    layers1, lm1, _ = model.make_weights(one, CPU, torch.Generator().manual_seed(0))
    assert one.active_experts(1) == (4, 1)  # ceil(8 * (1 - (1 - 4/64)^8)) = ceil(3.2) touched, 8 * 4 / 8 pairs
    assert model.weight_bytes(one, layers1, lm1, 1) < model.weight_bytes(one, layers1, lm1, 64)


# -- one tiny step ---------------------------------------------------------------------------------------------------
def test_inputs_match_sglang_geometry() -> None:
    shape, b, ctx, cap = model.TINY, 3, 512, 2048
    inp = model.make_inputs(shape, b, ctx, cap, CPU, torch.Generator().manual_seed(1))
    assert inp.page_table.shape == (b, cap // 64) and inp.seq_lens.tolist() == [ctx] * b
    real = inp.page_table[:, : ctx // 64]
    assert len(set(real.flatten().tolist())) == real.numel()  # real pages are not shared
    assert (inp.new_slot // 64 == real[:, -1].long()).all() and (inp.new_slot % 64 == (ctx - 1) % 64).all()
    assert inp.decode_lens.tolist() == [min(ctx, shape.index_topk)] * b
    for c in inp.caches.values():
        assert c.kv.shape == (b * ctx // 64, 64, 1, 656) and c.idx_keys.shape == (b * ctx // 64, 64, 1, 132)
    assert set(inp.caches) == {"dense", "moe"}
    page = inp.new_slot // 64
    assert (inp.idx_key_write[:, 0] == page * 8448 + (inp.new_slot % 64) * 128).all()
    assert (inp.idx_scale_write[:, 0] == page * 8448 + 8192 + (inp.new_slot % 64) * 4).all()
    for bad_ctx in (shape.index_topk, 500, cap + 64):
        with pytest.raises(ValueError, match="index_topk"):
            model.make_inputs(shape, 1, bad_ctx, cap, CPU, torch.Generator())


def test_tiny_step_runs_the_indexer_on_every_layer() -> None:
    step, inp = tiny_step(model.SPARSEMLA)
    widths: list[int] = []
    real_logits = step._logits

    def spy(*args):
        out = real_logits(*args)
        widths.append(out.shape[1])
        return out

    step._logits = spy
    kv_before = {k: c.kv.clone() for k, c in inp.caches.items()}
    tokens = step()
    assert tokens.shape == (2,) and tokens.dtype == torch.int64 and ((0 <= tokens) & (tokens < 512)).all()
    assert step.calls == {"indexer": 4, "decode": 4}
    assert widths == [inp.cap] * 4  # the logits span the page-table width, as sglang's decode graph allocates them
    for kind, c in inp.caches.items():
        assert c.topk_slots.shape == (2, model.TINY.index_topk) and (c.topk_slots >= 0).all()
        for b in range(2):
            slots = c.topk_slots[b].long()
            assert len(set(slots.tolist())) == slots.numel()  # distinct slots of the request's own pages
            assert set((slots // 64).tolist()) <= set(inp.page_table[b, : inp.ctx // 64].tolist())
        changed = (c.kv.view(-1, 656) != kv_before[kind].view(-1, 656)).any(dim=1).nonzero().flatten()
        assert set(changed.tolist()) <= set(inp.new_slot.tolist())  # only the new token's row is written


def test_both_states_compute_the_same_step() -> None:
    """On the CPU our decode is the fp32 reference, and so is the FlashMLA stand-in: both states must give the same
    tokens, and the FlashMLA path must pass q padded to 64 heads (zero pad rows) with one schedule per point."""
    fake = FakeFlashMLA()
    ours, _ = tiny_step(model.SPARSEMLA, seed=4)
    ref, _ = tiny_step(model.FLASHMLA, flash_mla=fake, seed=4)
    assert torch.equal(ours(), ref())
    decodes = [c for c in fake.calls if "decode" in c]
    assert len(decodes) == model.TINY.num_layers and all(c["decode"] == (2, 1, 64, V32_DIM) for c in decodes)
    assert all(c["pad_rows_zero"] for c in decodes)
    assert [c for c in fake.calls if "schedule" in c] == [{"schedule": [128, 128], "topk": 128}]  # min(seq_len, topk)
    with pytest.raises(ValueError, match="flash_mla"):
        tiny_step(model.FLASHMLA)


INTERPRETER_RUN = """
from dataclasses import replace
import json, torch
from benchmarks import step_model_v32 as m, step_v32 as bench
shape = replace(m.TINY, index_topk=512, num_layers=2)  # Triton's top-k takes k in {512, 1024, 2048}
gen = torch.Generator().manual_seed(0)
layers, lm, norm = m.make_weights(shape, torch.device("cpu"), gen)
inp = m.make_inputs(shape, 1, 1024, 2048, torch.device("cpu"), gen)
step = m.DecodeStepV32(shape, layers, lm, norm, inp, "sparsemla")
tokens = step()
checks = bench.consistency_checks(shape, inp, gen, ("sparsemla",))
print(json.dumps({"tokens": tokens.tolist(), "calls": dict(step.calls), **checks}))
"""


def test_the_triton_path_on_the_interpreter() -> None:
    """The flags-on step through the Triton kernels themselves (Triton's CPU interpreter, in a child process: the
    variable is read when the kernels are defined): their call contracts hold at the harness's arguments (padded
    64-head q, 16 indexer heads, the page-table-wide logits), and the consistency check agrees with the references."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = flags.child_env({"TRITON_INTERPRET": "1", "PYTHONPATH": str(root)})
    done = subprocess.run([sys.executable, "-c", INTERPRETER_RUN], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["calls"] == {"indexer": 2, "decode": 2} and len(got["tokens"]) == 1
    assert got["indexer_topk_agreement"] == 1.0 and got["decode_rel_err_sparsemla"] < 1e-3


# -- options ---------------------------------------------------------------------------------------------------------
def test_default_options_are_the_issues_grid() -> None:
    shape, bs, ctxs, cap, states = bench.parse_options("1,16,32,64", "4096,32768", bench.CAP, "sparsemla,flashmla", 1,
                                                       False)  # fmt: skip
    assert shape == model.V32 and bs == (1, 16, 32, 64) and ctxs == (4096, 32768) and cap == 163840
    assert states == ("sparsemla", "flashmla")
    shape, *_ = bench.parse_options("1", "4096", bench.CAP, "flashmla", 8, False)
    assert shape.local_heads == 16
    shape, bs, ctxs, cap, states = bench.parse_options("1,16,32,64", "4096,32768", bench.CAP, "sparsemla,flashmla", 1,
                                                       True)  # fmt: skip
    assert shape == model.TINY and (bs, ctxs, cap, states) == ((1, 2), (512,), 2048, ("sparsemla",))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("1", "4096", bench.CAP, "fast"), "--states"),
        (("1", "2048", bench.CAP, "sparsemla"), "--contexts"),
        (("1", "4000", bench.CAP, "sparsemla"), "--contexts"),
        (("0", "4096", bench.CAP, "sparsemla"), "--batches"),
        (("x", "4096", bench.CAP, "sparsemla"), "--batches"),
        (("1", "4096", 4000, "sparsemla"), "--cap"),
    ],
)
def test_bad_options_are_refused(args: tuple, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        bench.parse_options(*args, 1, False)


def test_cli_checks_options_before_cuda(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(bench.app, ["--states", "bogus", "--out-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--states" in result.output
    if not torch.cuda.is_available():
        result = runner.invoke(bench.app, ["--out-dir", str(tmp_path)])
        assert result.exit_code == 2 and "needs a CUDA GPU" in result.output
    assert not list(tmp_path.iterdir())


# -- the JSON ----------------------------------------------------------------------------------------------------------
def test_tiny_run_writes_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "step_v32-cpu.json"
    fake = FakeFlashMLA()
    doc = bench.run_bench(
        shape=model.TINY, device=CPU, batches=(1, 2), contexts=(512,), cap=2048, states=("sparsemla", "flashmla"),
        out_path=out, trace_dir=None, flash_mla=fake, deep_gemm="not installed", target_s=0.0, min_reps=1,
        max_reps=1, log=lambda _: None,
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    assert doc["op"] == "step_v32" and doc["errors"] == [] and doc["skipped"] == []
    assert {(r["state"], r["B"], r["ctx"]) for r in doc["rows"]} == {
        (s, b, 512) for s in ("sparsemla", "flashmla") for b in (1, 2)
    }
    for r in doc["rows"]:
        assert {"state", "B", "ctx", "us", "tok_s"} <= set(r) and r["us"] > 0 and r["mode"] == "eager"
        assert r["tok_s"] == pytest.approx(r["B"] / (r["us"] * 1e-6))
    cell = {(r["state"], r["B"]): r["us"] for r in doc["rows"]}
    assert doc["speedup"]["512"]["2"] == pytest.approx(cell[("flashmla", 2)] / cell[("sparsemla", 2)])
    assert doc["marginal_us"]["sparsemla"]["512"] == pytest.approx(cell[("sparsemla", 2)] - cell[("sparsemla", 1)])
    checks = doc["checks"]
    assert checks["B"] == 2 and checks["indexer_topk_agreement"] == 1.0
    # bf16 outputs of the same fp32 function: the padded (64-head) call and the 4-head reference reduce in another
    # order on some CPUs' BLAS, so an element may round to the neighbouring bf16 value; a wrong decode is O(1) off
    bf16_half_ulp = 2.0**-9
    assert checks["decode_rel_err_sparsemla"] < bf16_half_ulp and checks["decode_rel_err_flashmla"] < bf16_half_ulp
    assert doc["model"]["layer_types"] == {"dense": 1, "moe": 3} and doc["model"]["indexer_layers"] == 4
    assert doc["model"]["decode_heads"] == {"real": 4, "passed_to_decode": 64}
    states = doc["states"]
    assert states["sparsemla"]["measured"] and states["sparsemla"]["flags"] == [
        "SPARSEMLA_DSA_V32",
        "SPARSEMLA_TRITON_INDEXER",
    ]
    assert states["flashmla"]["measured"] and "not installed" in states["flashmla"]["stands_in_for"]
    assert "1.0.0+cpu-test" in states["flashmla"]["decode"] and doc["versions"]["flash_mla"] == "1.0.0+cpu-test"
    assert "no DeepSeek-V3.2 path" in doc["flags_off"]
    assert set(doc["memory"]) == {"1", "2"} and set(doc["weight_bytes_per_step"]) == {"1", "2"}
    lines: list[str] = []
    bench.print_summary(doc, lines.append)
    assert any(line.split()[:2] == ["512", "2"] for line in lines)


def test_flashmla_not_loaded_and_the_budget(tmp_path: Path) -> None:
    """No FlashMLA: the state is recorded as not measured, with why; a spent budget skips points but still writes."""
    doc = bench.run_bench(
        shape=model.TINY, device=CPU, batches=(1, 2), contexts=(512,), cap=2048, states=("sparsemla", "flashmla"),
        out_path=tmp_path / "a.json", trace_dir=None, flash_mla_reason="flash_mla is not importable", target_s=0.0,
        min_reps=1, max_reps=1, log=lambda _: None,
    )  # fmt: skip
    entry = doc["states"]["flashmla"]
    assert entry["measured"] is False and entry["reason"] == "flash_mla is not importable"
    assert {r["state"] for r in doc["rows"]} == {"sparsemla"} and doc["speedup"] == {}
    assert set(doc["checks"]) >= {"indexer_topk_agreement", "decode_rel_err_sparsemla"}
    spent = bench.run_bench(
        shape=model.TINY, device=CPU, batches=(1, 2), contexts=(512, 1024), cap=2048, states=("sparsemla",),
        out_path=tmp_path / "b.json", trace_dir=None, budget_s=0.0, log=lambda _: None,
    )  # fmt: skip
    assert spent["rows"] == [] and len(spent["skipped"]) == 4
    assert json.loads((tmp_path / "b.json").read_text())["skipped"] == spent["skipped"]
    with pytest.raises(ValueError, match="unknown state"):
        bench.run_bench(shape=model.TINY, device=CPU, batches=(1,), contexts=(512,), cap=2048, states=("fast",),
                        out_path=tmp_path / "c.json", trace_dir=None)  # fmt: skip


def test_derived_tables_and_summary_from_synthetic_rows() -> None:
    rows = [
        {"state": s, "B": b, "ctx": c, "us": us, "tok_s": b / (us * 1e-6)}
        for s, base in (("sparsemla", 20_000.0), ("flashmla", 21_000.0))
        for c in (4096, 32768)
        for b, us in ((1, base), (16, base + 1500), (64, base + 6300))
    ]
    rows.append({"state": "sparsemla", "B": 32, "ctx": 4096, "us": 24_000.0, "tok_s": 32 / 0.024})  # no flashmla row
    speedup, marginal = bench.derived_tables(rows)
    assert speedup["4096"] == {"1": 1.05, "16": 22_500 / 21_500, "64": 27_300 / 26_300}
    assert set(speedup) == {"4096", "32768"} and "32" not in speedup["4096"]
    assert marginal["flashmla"]["32768"] == pytest.approx(100.0)  # 100 µs per extra request
    doc = {
        "rows": rows, "speedup": speedup, "states": {"flashmla": {"measured": True}}, "checks": {"rows": 8},
        "errors": [], "kernel_share": {"sparsemla": {"4096": {"1": {"total_gpu_us": 19_000.0,
                                                                       "categories": {"gemm": 0.9, "other": 0.1}}}}},
    }  # fmt: skip
    lines: list[str] = []
    bench.print_summary(doc, lines.append)
    assert any("1.050x" in line for line in lines) and any("gemm=90.0%" in line for line in lines)
