"""SPARSEMLA_DSA_V32 through sglang 0.5.23's REAL loader, backend resolution and DSA backend methods.

Each case runs ``load_plugins()`` in a fresh process (hooks are process-wide and applied once) with the GPU reported
as sm_120, sm_89, sm_80 (and sm_90 / sm_100 as controls) by replacing ``torch.cuda.get_device_capability`` -- the
only device query sglang's DSA resolution makes. FlashMLA's CUDA extension cannot load on a CPU, so the process puts
``tests/fixtures/fake_flash_mla`` on its path: the names sglang imports, whose kernels record the call and raise as
on a GPU they have no image for. Then:

* resolution: sglang's pass as sglang's ``model_hook`` calls it (our hook) against sglang's original (``__wrapped__``);
* kernels: sglang's own ``DeepseekSparseAttnBackend._forward_flashmla_kv`` / ``_compute_flashmla_metadata`` /
  ``_forward_flashmla_sparse`` on a stand-in ``self`` with the attributes they read, inputs built with sglang's own
  ``quantize_k_cache`` / ``dequantize_k_cache`` (the 656-byte layout's oracle), outputs against fp32 attention;
* indexer: V3.2's paged logits (``dsa/utils._fp8_paged_mqa_logits_torch``) and top-k v2 (``dsa_topk_backend.
  _topk_transform_v2_paged``) against sglang's torch logits and a torch top-k.

Depends on the sibling ops ``sparsemla.kernels.sparse_decode.api.sparse_decode_v32`` and
``sparsemla.kernels.sparse_prefill.api.sparse_prefill`` (the kernel cases).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparsemla import flags

pytestmark = pytest.mark.sglang

pytest.importorskip("sglang.srt.plugins", reason="sglang 0.5.23 contract tier not installed")

FAKE_FLASH_MLA = Path(__file__).resolve().parent / "fixtures" / "fake_flash_mla"
GPUS = {"sm_120": (12, 0), "sm_89": (8, 9), "sm_80": (8, 0), "sm_90": (9, 0), "sm_100": (10, 0)}
NO_DSA_KERNEL = ("sm_120", "sm_89", "sm_80")
KV_DTYPES = ("fp8_e4m3", "bfloat16")
ALL_OFF = {name: None for name in ("SPARSEMLA_MMA_DECODE", "SGLANG_SM120_MMA_FLASHMLA", "SPARSEMLA_TRITON_INDEXER",
                                   "SPARSEMLA_STEP_METRICS", "SPARSEMLA_DISABLE", "SPARSEMLA_FORCE_REFERENCE",
                                   "SPARSEMLA_DSA_V32", "PROMETHEUS_MULTIPROC_DIR")}  # fmt: skip

# sglang's torch paths (SM120 decode module, paged MQA logits) and Triton's CPU interpreter for our kernels.
BASE_ENV = {"SGLANG_SM120_FLASHMLA_BACKEND": "torch", "TRITON_INTERPRET": "1", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1"}

DRIVER = r"""
import json, sys, types
import torch

GPU = {"cap": (12, 0)}
torch.cuda.get_device_capability = lambda *a, **k: GPU["cap"]  # the only device query of sglang's DSA resolution

import sglang.srt.plugins as plugins
plugins.load_plugins()
import flash_mla
from sglang.srt.arg_groups import model_hook, overrides
from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend as Backend
from sparsemla.plugin import sglang as sp

report = {"applied": sp.applied_hooks(), "resolution": {}, "kernels": {}, "indexer": {}}
GPUS = json.loads(sys.argv[1])


def view(arch, kv, rank=512, rope=64):
    hf = types.SimpleNamespace(architectures=[arch], index_topk=2048, kv_lora_rank=rank, qk_rope_head_dim=rope)
    return types.SimpleNamespace(kv_cache_dtype=kv, dsa_prefill_backend=None, dsa_decode_backend=None,
                                 enable_hisparse=False, dcp_size=1, _model_config=types.SimpleNamespace(hf_config=hf))


hooked = model_hook._dsa_split_backend_resolution  # what sglang's model_hook calls (propagated by HookRegistry)
report["resolution_hooked"] = hooked is not overrides._dsa_split_backend_resolution.__wrapped__
report["resolution_same_function"] = hooked is overrides._dsa_split_backend_resolution
for gpu, cap in GPUS.items():
    GPU["cap"] = tuple(cap)
    for kv in ("fp8_e4m3", "bfloat16"):
        for arch, rank, rope in (("DeepseekV32ForCausalLM", 512, 64), ("GlmMoeDsaForCausalLM", 512, 64),
                                 ("GlmMoeDsaForCausalLM", 512, 0)):
            key = f"{gpu}/{kv}/{arch}/rope{rope}"
            ours = hooked(view(arch, kv, rank, rope))
            theirs = overrides._dsa_split_backend_resolution.__wrapped__(view(arch, kv, rank, rope))
            report["resolution"][key] = {"ours": ours, "sglang": theirs}


def attention(q, rows, valid, scale):
    scores = torch.einsum("nhd,ntd->nht", q.float(), rows.float() * valid.unsqueeze(-1)) * scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    w = torch.exp(scores - lse.masked_fill(torch.isneginf(lse), float("inf")).unsqueeze(-1))
    return torch.einsum("nht,ntv->nhv", w, rows.float()[..., :512] * valid.unsqueeze(-1)), lse


def err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def run(name, fn):
    before = len(flash_mla.CALLS)
    try:
        out = fn()
        report["kernels"][name] = {"ok": True, **out, "flashmla_calls": flash_mla.CALLS[before:]}
    except Exception as exc:
        report["kernels"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400],
                                   "flashmla_calls": flash_mla.CALLS[before:]}


from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache
from sglang.kernels.ops.attention.dsa.dequant_k_cache import dequantize_k_cache

gen = torch.Generator().manual_seed(32)
T, H, TOPK, PAGES, SCALE = 3, 16, 128, 4, 0.1352
latent = torch.randn(PAGES, 64, 1, 576, generator=gen).to(torch.bfloat16)
pool_fp8 = quantize_k_cache(latent).view(PAGES * 64, 1, 656)  # sglang's own 656-byte writer
rows_fp8 = dequantize_k_cache(pool_fp8.view(PAGES, 64, 1, 656)).view(PAGES * 64, 576)  # and its reader
idx = torch.randint(0, PAGES * 64, (T, TOPK), generator=gen, dtype=torch.int32)
idx[1, 90:] = -1
idx[2] = -1
q = torch.randn(T, H, 576, generator=gen).to(torch.bfloat16)
lens = torch.tensor([TOPK, 90, 0], dtype=torch.int32)
layer = types.SimpleNamespace(tp_q_head_num=H, head_dim=576)

for gpu in ("sm_120", "sm_89", "sm_80"):
    GPU["cap"] = tuple(GPUS[gpu])
    major = GPUS[gpu][0]

    def flashmla_kv():
        me = types.SimpleNamespace(flashmla_kv_num_q_heads=64, dsa_index_topk=TOPK, physical_page_size=64,
                                   kv_cache_dim=656, dsa_kv_cache_store_fp8=True, flashmla_kv_format="V32")
        meta = types.SimpleNamespace(dsa_cache_seqlens_int32=lens,
                                     flashmla_metadata=Backend._compute_flashmla_metadata(me, lens, 1))
        o = Backend._forward_flashmla_kv(me, q_all=q, kv_cache=pool_fp8, v_head_dim=512, sm_scale=SCALE, layer=layer,
                                         metadata=meta, page_table_1=idx)
        valid = idx >= 0
        ref, _ = attention(q, rows_fp8[idx.clamp(min=0).long()], valid, SCALE)
        return {"shape": list(o.shape), "err": err(o[:, 0], ref)}

    def flashmla_sparse():
        kv = latent.view(PAGES * 64, 1, 576)
        me = types.SimpleNamespace(device_sm_major=major, _sink_pad_cache={})
        o = Backend._forward_flashmla_sparse(me, q_all=q, kv_cache=kv, v_head_dim=512, page_table_1=idx,
                                             sm_scale=SCALE, topk_length=lens)
        pos = torch.arange(TOPK).view(1, -1)
        valid = (idx >= 0) & (pos < lens.view(-1, 1))
        ref, _ = attention(q, kv[idx.clamp(min=0).long(), 0], valid, SCALE)
        return {"shape": list(o.shape), "err": err(o, ref)}

    run(f"{gpu}/flashmla_kv", flashmla_kv)
    run(f"{gpu}/flashmla_sparse", flashmla_sparse)

# -- V3.2 indexer: paged logits through sglang's torch resolver entry, top-k v2 through sglang's DSA top-k ---------
from sglang.srt.layers.attention.dsa import dsa_topk_backend, utils as dsa_utils
from sglang.srt.layers.attention.dsv4 import indexer as dsv4_indexer
from sglang.kernels.ops.attention.dsv4 import topk as dsv4_topk
from sparsemla.kernels import layouts
from sparsemla import flags

if not flags.SPARSEMLA_TRITON_INDEXER.get():  # sglang's own top-k v2 is a JIT CUDA kernel: nothing to run on a CPU
    print("REPORT " + json.dumps(report))
    sys.exit(0)
report["indexer"]["topk_v2_hooked"] = hasattr(dsv4_topk.topk_transform_paged_v2, "__wrapped__")
report["indexer"]["plan_v2_hooked"] = hasattr(dsv4_topk.plan_topk_v2, "__wrapped__")
report["indexer"]["logits_torch_hooked"] = hasattr(dsv4_indexer.fp8_paged_mqa_logits_torch, "__wrapped__")
seq = torch.tensor([900, 1, 600], dtype=torch.int32)  # longer and shorter than k = 512 (our top-k sizes: 512..2048)
cache = layouts.random_indexer_cache(40, generator=gen)
table = layouts.random_page_table(seq, 16, 40, generator=gen)
qi = torch.randn(3, 1, 64, 128, generator=gen).to(torch.float8_e4m3fn)
wi = torch.randn(3, 64, generator=gen)
logits = dsa_utils._fp8_paged_mqa_logits_torch(qi, cache, wi, seq.view(-1, 1), table, None, 1024)
want = dsv4_indexer.fp8_paged_mqa_logits_torch.__wrapped__(qi, cache, wi, seq, table, None, 1024, False)
mask = torch.arange(1024).view(1, -1) < seq.view(-1, 1)
report["indexer"]["logits_err"] = err(logits[mask], want[mask])
k = 512
lengths = seq.clone()
meta = types.SimpleNamespace(real_page_table=table, page_size=64, topk_v2_plan=dsv4_topk.plan_topk_v2(lengths))
scores = torch.randn(3, 1024, generator=gen)
got = dsa_topk_backend._topk_transform_v2_paged(scores, lengths, k, meta)
ok = True
for r in range(3):
    n = int(lengths[r])
    best = torch.topk(scores[r, :n], min(k, n)).indices
    slots = table[r, best // 64].long() * 64 + best % 64
    ok &= set(got[r][got[r] >= 0].tolist()) == set(slots.tolist()) and int((got[r] >= 0).sum()) == min(k, n)
report["indexer"]["topk_v2_exact"] = bool(ok)
print("REPORT " + json.dumps(report))
"""


def _run(env: dict[str, str | None], with_flash_mla: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
    extra = {"PYTHONPATH": str(FAKE_FLASH_MLA)} if with_flash_mla else {"PYTHONPATH": None}
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(GPUS)],
        env=flags.child_env({**BASE_ENV, **ALL_OFF, **extra, **env}),
        capture_output=True,
        text=True,
        timeout=560,
    )
    reports = [ln.removeprefix("REPORT ") for ln in res.stdout.splitlines() if ln.startswith("REPORT ")]
    return res, json.loads(reports[-1]) if reports else {}


@pytest.fixture(scope="module")
def flag_on() -> dict:
    res, report = _run({"SPARSEMLA_DSA_V32": "1", "SPARSEMLA_TRITON_INDEXER": "1"})
    assert res.returncode == 0 and report, res.stderr[-4000:]
    return report


@pytest.fixture(scope="module")
def flag_off() -> dict:
    res, report = _run({})
    assert res.returncode == 0 and report, res.stderr[-4000:]
    return report


# -- the loader --------------------------------------------------------------------------------------------------------
def test_sglang_applies_every_dsa_v32_hook(flag_on, flag_off):
    names = ("dsa_v32_resolution", "dsa_v32_decode", "dsa_v32_schedule", "dsa_v32_prefill")
    for report in (flag_on, flag_off):
        assert all(report["applied"].get(n) for n in names), report["applied"]
        assert report["resolution_hooked"] and report["resolution_same_function"]


def test_flag_on_without_flash_mla_stops_startup():
    """On a box without sgl-flash-mla, sglang's flashmla_* impls cannot even import their entry points: the flag
    cannot be honoured, so startup stops naming the missing module (never serving with the flag silently void)."""
    res, report = _run({"SPARSEMLA_DSA_V32": "1"}, with_flash_mla=False)
    assert res.returncode != 0 and report == {}
    assert "SPARSEMLA_DSA_V32 needs sglang.kernels.ops.attention.flash_mla_interface." in res.stderr, res.stderr[-3000:]
    assert "flash_mla is not importable" in res.stderr


# -- resolution --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", NO_DSA_KERNEL)
@pytest.mark.parametrize("kv", KV_DTYPES)
def test_flag_on_v32_resolves_to_an_impl_whose_kernels_are_ours(flag_on, gpu, kv):
    got = flag_on["resolution"][f"{gpu}/{kv}/DeepseekV32ForCausalLM/rope64"]
    sglang_choice = got["sglang"]
    assert {"trtllm", "fa3"} & set(sglang_choice.values()) or gpu != "sm_120", sglang_choice  # the bug being fixed
    want = {"fp8_e4m3": ("flashmla_kv", "flashmla_kv"), "bfloat16": ("flashmla_sparse", "flashmla_sparse")}[kv]
    assert (got["ours"]["dsa_prefill_backend"], got["ours"]["dsa_decode_backend"]) == want, got


@pytest.mark.parametrize("gpu", ("sm_90", "sm_100"))
@pytest.mark.parametrize("kv", KV_DTYPES)
def test_flag_on_leaves_gpus_with_sglang_kernels_alone(flag_on, gpu, kv):
    got = flag_on["resolution"][f"{gpu}/{kv}/DeepseekV32ForCausalLM/rope64"]
    assert got["ours"] == got["sglang"]


def test_flag_on_leaves_glm_sm12_flashinfer_and_nope_models_alone(flag_on):
    glm = flag_on["resolution"]["sm_120/fp8_e4m3/GlmMoeDsaForCausalLM/rope64"]
    assert glm["ours"] == glm["sglang"] and glm["ours"]["dsa_decode_backend"] == "flashinfer_sparse_mla"
    for kv in KV_DTYPES:  # a NoPE cache (528 B/token) is not a layout our kernels read
        nope = flag_on["resolution"][f"sm_120/{kv}/GlmMoeDsaForCausalLM/rope0"]
        assert nope["ours"] == nope["sglang"]


def test_flag_off_resolution_is_sglang_bit_for_bit(flag_off):
    assert flag_off["resolution"]
    for key, got in flag_off["resolution"].items():
        assert got["ours"] == got["sglang"], key
    assert flag_off["resolution"]["sm_120/fp8_e4m3/DeepseekV32ForCausalLM/rope64"]["ours"]["dsa_decode_backend"] == (
        "trtllm"
    )


# -- kernels -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", NO_DSA_KERNEL)
@pytest.mark.parametrize("impl", ("flashmla_kv", "flashmla_sparse"))
def test_flag_on_sglang_backend_methods_run_our_ops_and_match(flag_on, gpu, impl):
    got = flag_on["kernels"][f"{gpu}/{impl}"]
    assert got["ok"], got
    assert got["flashmla_calls"] == [], "FlashMLA itself must not be reached with the flag on"
    assert got["shape"] == ([3, 1, 16, 512] if impl == "flashmla_kv" else [3, 16, 512])
    assert got["err"] < 2e-2, got


@pytest.mark.parametrize("gpu", NO_DSA_KERNEL)
def test_flag_off_sglang_calls_flashmla_itself(flag_off, gpu):
    kv = flag_off["kernels"][f"{gpu}/flashmla_kv"]
    assert not kv["ok"] and kv["flashmla_calls"] == ["get_mla_decoding_metadata"], kv
    sparse = flag_off["kernels"][f"{gpu}/flashmla_sparse"]
    assert not sparse["ok"] and sparse["flashmla_calls"] == ["flash_mla_sparse_fwd"], sparse


# -- indexer -----------------------------------------------------------------------------------------------------------
def test_v32_indexer_entry_points_carry_our_hooks(flag_on):
    ind = flag_on["indexer"]
    assert ind["topk_v2_hooked"] and ind["plan_v2_hooked"] and ind["logits_torch_hooked"], ind


def test_flag_on_v32_indexer_logits_and_topk_match_sglang_torch(flag_on):
    ind = flag_on["indexer"]
    assert ind["logits_err"] < 2e-2, ind
    assert ind["topk_v2_exact"], ind
