"""Contract tier: sglang 0.5.23's REAL plugin loader, HookRegistry and torch reference kernels as oracles.

sglang's own ``load_plugins()`` discovers our entry point and applies our hooks; then sglang's own entry points are
called exactly as its DSv4 backend and indexer call them. Flag off must give sglang's result bit for bit; flag on
must give our op's result, which must match sglang's torch path within bf16 tolerance.

Note: HookRegistry rebinds every module attribute that *is* an original function (test modules included), so the
originals are kept in a dict, which it does not touch.
"""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import layouts

pytestmark = pytest.mark.sglang

sglang_plugins = pytest.importorskip("sglang.srt.plugins", reason="sglang 0.5.23 contract tier not installed")

SGLANG_ROOT = Path(sglang_plugins.__file__).resolve().parents[3]  # site-packages
ORIGINALS: dict[str, object] = {}


@pytest.fixture(scope="module")
def sgl():
    """sglang's decode and indexer modules after sglang's own load_plugins() ran our entry point."""
    from sglang.kernels.ops.attention import flash_mla_sm120
    from sglang.srt.layers.attention.dsv4 import indexer

    assert flash_mla_sm120._sm120_default_backend == "torch", "conftest must select sglang's torch path before import"
    ORIGINALS.setdefault("decode", flash_mla_sm120.flash_mla_with_kvcache_sm120)
    ORIGINALS.setdefault("decode_torch", flash_mla_sm120._sm120_sparse_decode_fwd)
    ORIGINALS.setdefault("indexer", indexer.fp8_paged_mqa_logits_torch_sm120)
    ORIGINALS.setdefault("indexer_torch", indexer.fp8_paged_mqa_logits_torch)
    ORIGINALS.setdefault("topk", indexer.topk_transform_pytorch_vectorized)
    sglang_plugins.load_plugins()
    return flash_mla_sm120, indexer


def test_sglang_version_is_the_tested_one():
    assert importlib.metadata.version("sglang") == "0.5.23"


def test_entry_point_is_discovered():
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert "sparsemla" in eps.names
    assert eps["sparsemla"].value == "sparsemla.plugin.sglang:register"


def test_load_plugins_applies_our_hooks(sgl):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sparsemla.plugin.sglang import HOOKS

    flash_mla_sm120, indexer = sgl
    assert flash_mla_sm120.flash_mla_with_kvcache_sm120 is not ORIGINALS["decode"]
    assert flash_mla_sm120.flash_mla_with_kvcache_sm120.__wrapped__ is ORIGINALS["decode"]
    assert indexer.fp8_paged_mqa_logits_torch_sm120.__wrapped__ is ORIGINALS["indexer"]
    for spec in HOOKS:
        if spec.requires is None and spec.call != "timer":
            assert spec.target in HookRegistry._patched, spec.target


def test_the_plugin_checked_what_sglang_applied_and_gave_apply_hooks_back(sgl):
    """register() verifies right after sglang's HookRegistry.apply_hooks(); its one-shot wrapper restores sglang's own
    method, and every hook registered here is found on its target."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sparsemla.plugin import sglang as sp

    assert HookRegistry.__dict__["apply_hooks"].__func__.__module__ == "sglang.srt.plugins.hook_registry"
    applied = sp.applied_hooks()
    assert applied and all(applied.values()), applied
    assert {s.name for s in sp.HOOKS if s.requires is None} <= set(applied)


# -- decode ----------------------------------------------------------------------------------------------------------
DECODE_CASES = [
    # (B, H, swa_topk, extra: (pages, page_size, topk) or None, sink, invalid_fraction, topk_length kind)
    pytest.param(2, 8, 128, None, False, 0.0, "full", id="B2-H8-swa128-noextra-nosink"),
    pytest.param(3, 8, 128, (8, 64, 256), True, 0.2, "short", id="B3-H8-swa128-extra256-sink-invalid"),
    pytest.param(2, 64, 64, (4, 64, 128), True, 0.1, "zero", id="B2-H64-swa64-extra128-sink-len0"),
    pytest.param(1, 64, 128, (4, 64, 192), False, 1.0, "full", id="B1-H64-all-invalid"),
]


def _decode_kwargs(batch, heads, swa_topk, extra, sink, invalid, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    main = layouts.random_v4_cache(2, 256, generator=gen)
    kwargs = dict(
        q=torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16),
        k_cache=main.k_cache,
        head_dim_v=512,
        softmax_scale=512**-0.5,
        indices=layouts.random_slots(batch, swa_topk, main.num_slots, generator=gen, invalid_fraction=invalid),
        topk_length=None,
        attn_sink=torch.randn(heads, generator=gen) if sink else None,
        extra_k_cache=None,
        extra_indices_in_kvcache=None,
        extra_topk_length=None,
    )
    if lengths == "short":
        kwargs["topk_length"] = torch.randint(0, swa_topk + 1, (batch,), generator=gen, dtype=torch.int32)
    elif lengths == "zero":
        kwargs["topk_length"] = torch.zeros(batch, dtype=torch.int32)
    if extra is not None:
        pages, page_size, topk = extra
        cache = layouts.random_v4_cache(pages, page_size, generator=gen)
        kwargs["extra_k_cache"] = cache.k_cache
        kwargs["extra_indices_in_kvcache"] = layouts.random_slots(
            batch, topk, cache.num_slots, generator=gen, invalid_fraction=invalid
        )
        kwargs["extra_topk_length"] = torch.randint(1, topk + 1, (batch,), generator=gen, dtype=torch.int32)
    return kwargs


@pytest.mark.parametrize("batch,heads,swa_topk,extra,sink,invalid,lengths", DECODE_CASES)
def test_decode_flag_off_is_sglang_bit_for_bit(sgl, batch, heads, swa_topk, extra, sink, invalid, lengths):
    flash_mla_sm120, _ = sgl
    kwargs = _decode_kwargs(batch, heads, swa_topk, extra, sink, invalid, lengths, seed=batch * 100 + heads)
    with flags.SPARSEMLA_MMA_DECODE.override(False):
        out, lse = flash_mla_sm120.flash_mla_with_kvcache_sm120(**kwargs)
    want_out, want_lse = ORIGINALS["decode"](**kwargs)
    assert torch.equal(out, want_out)
    assert torch.equal(lse, want_lse)


@pytest.mark.parametrize("batch,heads,swa_topk,extra,sink,invalid,lengths", DECODE_CASES)
def test_decode_flag_on_runs_our_op_and_matches_sglang_torch(
    sgl, batch, heads, swa_topk, extra, sink, invalid, lengths
):
    from sparsemla.kernels import sparse_decode

    flash_mla_sm120, _ = sgl
    kwargs = _decode_kwargs(batch, heads, swa_topk, extra, sink, invalid, lengths, seed=batch * 7 + heads)
    with flags.SPARSEMLA_MMA_DECODE.override(True):
        out, lse = flash_mla_sm120.flash_mla_with_kvcache_sm120(**kwargs)
    ours_out, ours_lse = sparse_decode(**kwargs)
    assert torch.equal(out, ours_out) and torch.equal(lse, ours_lse), "the hook must return our op's result"
    # sglang's own torch path as the oracle (same positional order as its entry point passes).
    names = ("q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale", "extra_k_cache",
             "extra_indices_in_kvcache", "extra_topk_length")  # fmt: skip
    want_out, want_lse = ORIGINALS["decode_torch"](*(kwargs[n] for n in names))
    assert out.shape == want_out.shape and out.dtype == want_out.dtype == torch.bfloat16
    assert lse.shape == want_lse.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), want_out.float(), atol=2e-2, rtol=2e-2)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    torch.testing.assert_close(lse[finite], want_lse[finite], atol=1e-3, rtol=1e-3)


def test_master_switch_wins(sgl):
    flash_mla_sm120, _ = sgl
    kwargs = _decode_kwargs(2, 8, 64, None, True, 0.0, "full", seed=5)
    with flags.SPARSEMLA_MMA_DECODE.override(True), flags.SPARSEMLA_DISABLE.override(True):
        out, _ = flash_mla_sm120.flash_mla_with_kvcache_sm120(**kwargs)
    want, _ = ORIGINALS["decode"](**kwargs)
    assert torch.equal(out, want)


def test_flag_on_errors_propagate(sgl):
    flash_mla_sm120, _ = sgl
    kwargs = _decode_kwargs(1, 8, 64, None, False, 0.0, "full", seed=9)
    kwargs["indices"] = kwargs["indices"][:, :, :].reshape(1, 64)  # wrong rank: our op must refuse, not fall back
    with flags.SPARSEMLA_MMA_DECODE.override(True), pytest.raises(ValueError, match="indices"):
        flash_mla_sm120.flash_mla_with_kvcache_sm120(**kwargs)


# -- indexer ---------------------------------------------------------------------------------------------------------
INDEXER_CASES = [
    pytest.param((1,), 4, id="B1-len1-cap4pages"),
    pytest.param((100, 0, 64, 65), 6, id="B4-mixed-lengths-cap6pages"),
    pytest.param((500, 7), 32, id="B2-cap-much-larger"),
]


def _indexer_args(seq_lens, max_pages, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    num_pages = sum(-(-s // 64) for s in seq_lens) + 3
    cache = layouts.random_indexer_cache(num_pages, generator=gen)
    table = layouts.random_page_table(lens, max_pages, num_pages, generator=gen)
    q = torch.randn(len(seq_lens), 1, 64, 128, generator=gen).to(torch.float8_e4m3fn)
    weights = torch.randn(len(seq_lens), 64, generator=gen)
    return (q, cache, weights, lens, table, None, max_pages * 64, False)


@pytest.mark.parametrize("seq_lens,max_pages", INDEXER_CASES)
def test_indexer_flag_off_is_sglang_bit_for_bit(sgl, seq_lens, max_pages):
    _, indexer = sgl
    args = _indexer_args(seq_lens, max_pages, seed=len(seq_lens))
    with flags.SPARSEMLA_TRITON_INDEXER.override(False):
        got = indexer.fp8_paged_mqa_logits_torch_sm120(*args)
    assert torch.equal(got, ORIGINALS["indexer"](*args))


@pytest.mark.parametrize("seq_lens,max_pages", INDEXER_CASES)
def test_indexer_flag_on_matches_sglang_on_valid_positions(sgl, seq_lens, max_pages):
    from sparsemla.kernels import indexer_logits

    _, indexer = sgl
    args = _indexer_args(seq_lens, max_pages, seed=10 + len(seq_lens))
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):
        got = indexer.fp8_paged_mqa_logits_torch_sm120(*args)
    assert torch.equal(got, indexer_logits(*args)) or _same_on_valid(got, indexer_logits(*args), seq_lens)
    want = ORIGINALS["indexer"](*args)
    assert got.shape == want.shape and got.dtype == torch.float32
    for row, length in enumerate(seq_lens):
        if length:
            ref = want[row, :length]
            torch.testing.assert_close(got[row, :length], ref, atol=2e-2 * ref.abs().max().item(), rtol=2e-2)


def test_indexer_torch_path_on_other_gpus_is_hooked_too(sgl):
    """fp8_paged_mqa_logits_torch (the non-SM120 torch path) asserts seq_lens [B] and a page table covering max_seq_len;
    flag off it is sglang's, flag on our op."""
    _, indexer = sgl
    q, cache, weights, lens, table, meta, width, clean = _indexer_args((100, 0, 64, 65), 6, seed=77)
    with flags.SPARSEMLA_TRITON_INDEXER.override(False):
        assert torch.equal(
            indexer.fp8_paged_mqa_logits_torch(q, cache, weights, lens, table, meta, width, clean),
            ORIGINALS["indexer_torch"](q, cache, weights, lens, table, meta, width, clean),
        )
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):
        got = indexer.fp8_paged_mqa_logits_torch(q, cache, weights, lens, table, meta, width, clean)
    want = ORIGINALS["indexer_torch"](q, cache, weights, lens, table, meta, width, clean)
    for row, length in enumerate(lens.tolist()):
        if length:
            ref = want[row, :length]
            torch.testing.assert_close(got[row, :length], ref, atol=2e-2 * ref.abs().max().item(), rtol=2e-2)


@pytest.mark.parametrize("k", [512, 1024])
def test_topk_transform_flag_off_is_sglang_and_flag_on_selects_the_same_slots(sgl, k):
    _, indexer = sgl
    gen = torch.Generator().manual_seed(k)
    lens = torch.tensor([1300, 700, 0, 1100][: 4 if k == 512 else 2], dtype=torch.int32)
    rows, width, page_size = len(lens), 1536, 64
    scores = torch.randn(rows, width, generator=gen)
    tables = torch.stack([torch.randperm(200, generator=gen)[: width // page_size] for _ in range(rows)]).int()

    def run(fn):
        out = torch.full((rows, k), -7, dtype=torch.int32)
        raw = torch.full((rows, k), -7, dtype=torch.int32)
        fn(scores.clone(), lens, tables, out, page_size, raw)
        return out, raw

    with flags.SPARSEMLA_TRITON_INDEXER.override(False):
        off = run(indexer.topk_transform_pytorch_vectorized)
    want = run(ORIGINALS["topk"])
    assert torch.equal(off[0], want[0]) and torch.equal(off[1], want[1])
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):
        on = run(indexer.topk_transform_pytorch_vectorized)
    for r in range(rows):
        got_slots, want_slots = on[0][r].sort().values, want[0][r].sort().values
        assert torch.equal(got_slots, want_slots), f"row {r}: different slot sets"
        assert torch.equal(on[1][r].sort().values, want[1][r].sort().values)


@pytest.fixture
def jit_topk(monkeypatch):
    """sglang's JIT top-k modules (v1, v2) replaced by recorders: what reaches them, with which tensors."""
    from sglang.kernels.ops.attention.dsv4 import topk as jit

    calls: list[tuple[str, str, tuple]] = []

    class Recorder:
        def __init__(self, version: str) -> None:
            self.version = version

        def __getattr__(self, entry: str):
            return lambda *args: calls.append((self.version, entry, args))

    monkeypatch.setattr(jit, "_jit_topk_v1_module", lambda: Recorder("v1"))
    monkeypatch.setattr(jit, "_jit_topk_v2_module", lambda: Recorder("v2"))
    return calls


def _topk_case(k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor([k + 788, k - 1, 0, k, k + 1, 3 * k], dtype=torch.int32)
    rows, width, page_size = len(lens), 4 * k, 64
    scores = torch.randn(rows, width, generator=gen)
    scores[1, :50] = scores[1, 60]  # ties inside a short row
    scores[0, : k + 100] = scores[0, : k + 100].round(decimals=1)  # ties at a long row's threshold
    tables = torch.stack([torch.randperm(4 * width // page_size, generator=gen)[: width // page_size] for _ in lens])
    return scores, lens, tables.int(), page_size


def _sglang_oracle(indexer, scores, lens, tables, page_size, k):
    out, raw = torch.full((len(lens), k), -7, dtype=torch.int32), torch.full((len(lens), k), -7, dtype=torch.int32)
    indexer._topk_transform_vectorized(scores.clone(), lens, tables, out, page_size, raw)
    return out, raw


def _agrees_with_sglang(out, raw, want_raw, scores, tables, page_size) -> None:
    """A valid top-k where sglang's is: per row the same multiset of selected scores (which of several equal scores at
    the threshold is taken may differ: torch.topk breaks ties arbitrarily, ours by position) and the same count of
    -1 pads; ``out`` is the page transform of ``raw``, slot for slot."""
    for row in range(raw.shape[0]):
        got, want = raw[row][raw[row] >= 0].long(), want_raw[row][want_raw[row] >= 0].long()
        assert got.numel() == want.numel(), f"row {row}: {got.numel()} selected, sglang {want.numel()}"
        assert torch.equal(scores[row, got].sort().values, scores[row, want].sort().values), f"row {row}"
        assert got.unique().numel() == got.numel(), f"row {row}: a position selected twice"
    pages = torch.gather(tables.long(), 1, raw.clamp(min=0).long() // page_size)
    slots = torch.where(raw >= 0, pages * page_size + raw.clamp(min=0).long() % page_size, -1)
    assert torch.equal(out.long(), slots)


def test_default_topk_flag_off_reaches_sglangs_jit_kernels_untouched(sgl, jit_topk):
    """Flag off, sglang's default top-k entries (v1, v2, the v2 plan) hand the very same tensors to its JIT modules."""
    import sglang.kernels.ops.attention.dsv4 as dsv4

    _, indexer = sgl
    scores, lens, tables, page_size = _topk_case(512, seed=3)
    out, raw = torch.empty(len(lens), 512, dtype=torch.int32), torch.empty(len(lens), 512, dtype=torch.int32)
    plan = torch.empty(len(lens) + 1, 2, dtype=torch.int32)
    with flags.SPARSEMLA_TRITON_INDEXER.override(False):
        indexer.topk_transform_paged(scores, lens, tables, out, page_size, raw)
        dsv4.plan_topk_v2(lens, out=plan)
        indexer.topk_transform_paged_v2(scores, lens, tables, out, page_size, plan, raw)
        with pytest.raises(ModuleNotFoundError, match="flashinfer"):  # sglang's own FlashInfer path, not installed
            indexer.topk_transform_flashinfer_fused(scores, lens, tables, out, page_size, raw)
    assert [(v, e) for v, e, _ in jit_topk] == [("v1", "topk_transform"), ("v2", "topk_plan"),
                                                ("v2", "topk_transform_paged")]  # fmt: skip
    v1_args, v2_args = jit_topk[0][2], jit_topk[2][2]
    assert all(a is b for a, b in zip(v1_args, (scores, lens, tables, out, page_size, raw), strict=True))
    assert v2_args[0] is scores and v2_args[2] is tables and any(a is plan for a in v2_args)


@pytest.mark.parametrize("k", [512, 2048])
@pytest.mark.parametrize("use_topk_v2", [False, True], ids=["v1", "v2"])
def test_default_topk_flag_on_runs_ours_through_sglangs_call_path(sgl, jit_topk, k, use_topk_v2):
    """Flag on, sglang's own ``topk_transform_paged_from_metadata`` (what the DSv4 indexer calls) reaches our top-k,
    never its JIT kernels, and selects sglang's torch reference's slots and positions (rows as sets: ties at the
    threshold may be broken differently, see _agrees_with_sglang)."""
    from types import SimpleNamespace

    import sglang.kernels.ops.attention.dsv4 as dsv4

    _, indexer = sgl
    scores, lens, tables, page_size = _topk_case(k, seed=k + use_topk_v2)
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):
        meta = SimpleNamespace(compressed_seq_lens=lens, page_table=tables, compressed_page_size=page_size,
                               use_topk_v2=use_topk_v2, topk_metadata=dsv4.plan_topk_v2(lens))  # fmt: skip
        out = torch.full((len(lens), k), -7, dtype=torch.int32)
        raw = torch.full((len(lens), k), -7, dtype=torch.int32)
        indexer.topk_transform_paged_from_metadata(scores.clone(), meta, out, raw)
    assert jit_topk == []
    assert tuple(meta.topk_metadata.shape) == (len(lens) + 1, 2)
    _, want_raw = _sglang_oracle(indexer, scores, lens, tables, page_size, k)
    _agrees_with_sglang(out, raw, want_raw, scores, tables, page_size)


@pytest.mark.parametrize("entry", ["topk_transform_flashinfer_unfused", "topk_transform_flashinfer_fused"])
def test_flashinfer_topk_flag_on_runs_ours(sgl, entry):
    _, indexer = sgl
    scores, lens, tables, page_size = _topk_case(512, seed=11)
    out = torch.full((len(lens), 512), -7, dtype=torch.int32)
    raw = torch.full((len(lens), 512), -7, dtype=torch.int32)
    with flags.SPARSEMLA_TRITON_INDEXER.override(True):
        getattr(indexer, entry)(scores.clone(), lens, tables, out, page_size, raw)
    _, want_raw = _sglang_oracle(indexer, scores, lens, tables, page_size, 512)
    _agrees_with_sglang(out, raw, want_raw, scores, tables, page_size)


def _same_on_valid(a, b, seq_lens):
    return all(torch.equal(a[r, :n], b[r, :n]) for r, n in enumerate(seq_lens))


# -- the contract our hooks rely on (a version bump that moves anything fails here) ----------------------------------
def _function_params(relpath: str, name: str) -> list[str]:
    tree = ast.parse((SGLANG_ROOT / relpath).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            a = node.args
            return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    raise AssertionError(f"{name} not found in {relpath}")


def _module_file(module: str) -> str:
    rel = module.replace(".", "/")
    return rel + "/__init__.py" if (SGLANG_ROOT / rel / "__init__.py").exists() else rel + ".py"


def _target_file(target: str) -> tuple[str, str]:
    """(file that defines the target, its name): a ``Class.method`` lives in the class's module; a name the module
    only re-exports (``from .topk import plan_topk_v2``, ``from ... import topk_transform_paged``) is followed to the
    module it comes from."""
    module, _, attr = target.rpartition(".")
    parts = module.split(".")
    if parts[-1][:1].isupper():  # a method: Class.method
        return _module_file(".".join(parts[:-1])), attr
    for _ in range(4):  # re-export chains are short
        tree = ast.parse((SGLANG_ROOT / _module_file(module)).read_text())
        if any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == attr for n in tree.body):
            break
        source = next(
            (n for n in tree.body if isinstance(n, ast.ImportFrom) and any(a.name == attr for a in n.names)), None
        )
        if source is None:
            break
        if source.level:  # relative: from .topk import ...
            base = module.split(".") if _module_file(module).endswith("__init__.py") else module.split(".")[:-1]
            base = base[: len(base) - source.level + 1]
            module = ".".join([*base, source.module] if source.module else base)
        else:
            module = source.module
    return _module_file(module), attr


def test_every_hook_target_exists_with_the_parameters_we_rely_on():
    from sparsemla.plugin.sglang import HOOKS

    for spec in HOOKS:
        if spec.target.startswith("deep_gemm."):
            continue  # compiled: checked by the GPU self-check where DeepGEMM is installed
        relpath, attr = _target_file(spec.target)
        params = _function_params(relpath, attr)
        missing = [p for p in spec.params if p not in params]
        assert not missing, f"{spec.target}: sglang no longer has parameters {missing} (has {params})"


def test_dsv4_backend_calls_the_decode_entries_with_keywords_we_accept():
    src = (SGLANG_ROOT / "sglang/srt/layers/attention/deepseek_v4_backend.py").read_text()
    tree = ast.parse(src)
    accepted = set(inspect.signature(_accepted_decode_kwargs).parameters)
    seen = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "flash_mla_with_kvcache_sm120",
            "flash_mla_with_kvcache",
        ):
            seen += 1
            names = {k.arg for k in node.keywords}
            assert names <= accepted, f"unknown keywords at line {node.lineno}: {names - accepted}"
    assert seen >= 2


def _accepted_decode_kwargs(
    q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache, extra_indices_in_kvcache,
    extra_topk_length, block_table, cache_seqlens, tile_scheduler_metadata, is_fp8_kvcache,
):  # fmt: skip
    """The keywords sparse_decode() accepts (used only for its signature)."""


def test_indexer_call_site_is_positional_in_our_order():
    src = (SGLANG_ROOT / "sglang/srt/layers/attention/dsv4/indexer.py").read_text()
    assert "fn = fp8_paged_mqa_logits_torch_sm120" in src, "sglang must look the function up at call time"
    assert "from deep_gemm import fp8_paged_mqa_logits as fn" in src


# -- plugin behaviour in fresh processes ------------------------------------------------------------------------------
def _run(code: str, env: dict[str, str | None]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=flags.child_env(env), capture_output=True, text=True, timeout=300
    )


def test_real_heads_reach_the_decode_op_through_sglangs_backend_method(sgl):
    """The backend-method hook records ``layer.tp_q_head_num`` while sglang's decode entry runs inside it, and the
    decode hook hands it to our op as ``num_real_heads``: a q padded to 64 heads computes only the 8 real ones (the
    pad rows hold garbage in sglang; NaN here) and equals sglang's torch path on those 8."""
    from sglang.srt.layers.attention import deepseek_v4_backend

    from sparsemla.plugin.real_heads import track_real_heads

    flash_mla_sm120, _ = sgl
    kw = _decode_kwargs(2, 8, 128, (4, 64, 128), True, 0.1, "short", seed=11)
    padded = dict(kw, q=torch.cat([kw["q"], torch.full((2, 1, 56, 512), float("nan"), dtype=torch.bfloat16)], 2))
    padded["attn_sink"] = torch.cat([kw["attn_sink"], torch.zeros(56)])
    layer = type("Layer", (), {"tp_q_head_num": 8})()
    hooked = deepseek_v4_backend.DeepseekV4AttnBackend._forward_attention
    assert hooked.__wrapped__ is not None, "sglang's loader did not wrap _forward_attention"

    def forward_attention(self, q, k, v, layer, *args, **kwargs):  # stands in for sglang's method body
        return flash_mla_sm120.flash_mla_with_kvcache_sm120(**padded)

    with flags.SPARSEMLA_MMA_DECODE.override(True):
        out, _ = track_real_heads(forward_attention, None, padded["q"], None, None, layer)
        outside, _ = flash_mla_sm120.flash_mla_with_kvcache_sm120(**kw)
    want, _ = ORIGINALS["decode"](**kw)
    assert out.shape == (2, 1, 64, 512) and not torch.isnan(out).any()
    assert torch.equal(out[:, :, 8:], torch.zeros_like(out[:, :, 8:]))
    err = (out[:, :, :8].float() - want.float()).norm() / want.float().norm()
    assert err < 1e-2, err
    assert torch.equal(outside, out[:, :, :8]), "the same op on the unpadded q"


def test_a_gpu_no_configuration_fits_stops_sglang_at_startup(monkeypatch):
    """An explicitly enabled kernel on a GPU older than sm_80 stops register() (sglang's startup) with the reason."""
    import torch as t

    from sparsemla.kernels import device as dev
    from sparsemla.plugin import sglang as sp

    monkeypatch.setattr(t.cuda, "is_available", lambda: True)
    monkeypatch.setattr(t.cuda, "device_count", lambda: 1)
    volta = dev.DeviceInfo((7, 0), 98_304, 80, 98_304, "Tesla V100-SXM2-32GB")
    with dev.assume(volta), flags.SPARSEMLA_MMA_DECODE.override(True), pytest.raises(SystemExit) as exc:
        sp._check_kernels_runnable()
    assert "GPU 0: Tesla V100-SXM2-32GB (sm_70" in str(exc.value) and "sm_80 or newer" in str(exc.value)
    with dev.assume(dev.target("sm_120")), flags.SPARSEMLA_MMA_DECODE.override(True):
        sp._check_kernels_runnable()  # the RTX PRO 6000's facts pass


def test_flags_info_metric_in_multiprocess_mode(tmp_path):
    code = """
import sglang.srt.plugins as p
p.load_plugins()
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
reg = CollectorRegistry()
MultiProcessCollector(reg)
print(generate_latest(reg).decode())
"""
    res = _run(code, {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "SPARSEMLA_MMA_DECODE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("sparsemla_kernel_flags_info{")]
    assert len(lines) == 1, res.stdout
    assert 'sparsemla_mma_decode="on"' in lines[0] and 'variant="mma_decode"' in lines[0]
    assert lines[0].endswith(" 1.0")


def test_bad_flag_value_stops_sglang_loudly():
    res = _run("import sglang.srt.plugins as p; p.load_plugins()", {"SPARSEMLA_SPLIT_K": "zero"})
    assert res.returncode != 0
    assert "SPARSEMLA_SPLIT_K" in res.stderr and "auto | a positive integer" in res.stderr


def test_untested_sglang_version_warns_once_and_hooks_nothing():
    """All flags off: one warning, no hooks, and the flag-info series still says ``baseline`` (with a flag on the
    same version stops startup: tests/test_reliability_plugin.py)."""
    code = """
import json, logging
logging.basicConfig(level=logging.WARNING)
from prometheus_client import REGISTRY, generate_latest
from sparsemla import variant
from sparsemla.plugin import sglang as sp
sp._sglang_version = lambda: "0.4.0"
print(json.dumps([sp.register(), variant.from_metrics(generate_latest(REGISTRY).decode())]))
"""
    res = _run(code, {"SPARSEMLA_MMA_DECODE": None, "SGLANG_SM120_MMA_FLASHMLA": None})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [[], "baseline"]
    assert res.stderr.count("not a tested version") == 1


def test_alias_of_the_seed_flag_enables_decode():
    code = "from sparsemla import flags, variant; print(flags.SPARSEMLA_MMA_DECODE.get(), variant.current())"
    res = _run(code, {"SGLANG_SM120_MMA_FLASHMLA": "1"})
    assert res.stdout.split() == ["True", "mma_decode"]


# -- flag on through sglang's real dispatch reaches the Triton kernels (CPU interpreter) -----------------------------
_INTERPRETER_CASE = """
import json, torch
import sglang.srt.plugins as plugins
from sglang.kernels.ops.attention import flash_mla_sm120 as m
from sglang.srt.layers.attention.dsv4 import indexer as ix
original_decode = m._sm120_sparse_decode_fwd
original_indexer = ix.fp8_paged_mqa_logits_torch_sm120
plugins.load_plugins()
from sparsemla.kernels import layouts
from sparsemla.kernels.sparse_decode import triton as decode_triton
from sparsemla.kernels.indexer import triton as indexer_triton

calls = {"decode": 0, "indexer": 0}
def counting(module, attr, key):
    inner = getattr(module, attr)
    def wrapper(*a, **k):
        calls[key] += 1
        return inner(*a, **k)
    setattr(module, attr, wrapper)
counting(decode_triton, "sparse_decode_fwd", "decode")
counting(indexer_triton, "indexer_logits_fwd", "indexer")

g = torch.Generator().manual_seed(7)
main = layouts.random_v4_cache(1, 256, generator=g)
extra = layouts.random_v4_cache(2, 64, generator=g)
kw = dict(q=torch.randn(2, 1, 8, 512, generator=g).to(torch.bfloat16), k_cache=main.k_cache, head_dim_v=512,
          softmax_scale=512 ** -0.5,
          indices=layouts.random_slots(2, 32, main.num_slots, generator=g, invalid_fraction=0.2),
          topk_length=torch.tensor([32, 9], dtype=torch.int32), attn_sink=torch.randn(8, generator=g),
          extra_k_cache=extra.k_cache,
          extra_indices_in_kvcache=layouts.random_slots(2, 32, extra.num_slots, generator=g),
          extra_topk_length=torch.tensor([5, 32], dtype=torch.int32))
out, lse = m.flash_mla_with_kvcache_sm120(**kw)
names = ("q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v", "softmax_scale", "extra_k_cache",
         "extra_indices_in_kvcache", "extra_topk_length")
want, want_lse = original_decode(*(kw[n] for n in names))
dec_err = ((out.float() - want.float()).norm() / want.float().norm()).item()

lens = torch.tensor([70, 3], dtype=torch.int32)
cache = layouts.random_indexer_cache(6, generator=g)
table = layouts.random_page_table(lens, 4, 6, generator=g)
q = torch.randn(2, 1, 64, 128, generator=g).to(torch.float8_e4m3fn)
w = torch.randn(2, 64, generator=g)
got = ix.fp8_paged_mqa_logits_torch_sm120(q, cache, w, lens, table, None, 256, False)
ref = original_indexer(q, cache, w, lens, table, None, 256, False)
idx_err = max(((got[r, :n] - ref[r, :n]).norm() / ref[r, :n].norm()).item() for r, n in enumerate(lens.tolist()))
print(json.dumps({"calls": calls, "decode_err": dec_err, "indexer_err": idx_err,
                  "lse_close": bool(torch.allclose(lse, want_lse, atol=1e-3, rtol=1e-3))}))
"""


def test_flags_on_route_sglang_calls_to_the_triton_kernels_under_the_interpreter():
    """SPARSEMLA_MMA_DECODE=1 / SPARSEMLA_TRITON_INDEXER=1: sglang's own entry points run our Triton kernels
    (counted at the launcher) and agree with sglang's torch paths. TRITON_INTERPRET must be set before Triton's JIT
    decorates the kernels, hence the fresh process."""
    env = {"TRITON_INTERPRET": "1", "SPARSEMLA_MMA_DECODE": "1", "SPARSEMLA_TRITON_INDEXER": "1"}
    res = _run(_INTERPRETER_CASE, env)
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["calls"]["decode"] >= 1 and got["calls"]["indexer"] >= 1, got
    assert got["decode_err"] < 1e-2 and got["lse_close"], got
    assert got["indexer_err"] < 1e-2, got
