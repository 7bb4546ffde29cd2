"""The GPUs the simulator has calibrations for, and what "flags off" (stock sglang 0.5.23) is on each.

Facts only (sources: the vendors' specifications as listed in ../shared/notes/portability.md, and what sglang 0.5.23
runs per GPU, ../shared/notes/portability.md "sglang 0.5.23's own paths per GPU" and sglang-0.5.23.md):

* H200 (sm_90): stock decode = FlashMLA (sgl-flash-mla), indexer = DeepGEMM ``fp8_paged_mqa_logits``, top-k = sgl-kernel
  JIT. The decode-step benchmark measured sglang's *fallback* kernels instead (the per-head Triton decode of
  ``flash_mla_sm120_triton.py`` and the torch indexer), because DeepGEMM did not load under the run's torch.
* RTX PRO 6000 Blackwell (sm_120): stock decode = FlashInfer's SM120 sparse MLA (``SGLANG_SM120_FLASHMLA_BACKEND``
  default ``flashinfer``), indexer = DeepGEMM's sm120 kernel, top-k = sgl-kernel JIT; ``SGLANG_SM120_FLASHMLA_BACKEND=
  triton`` selects the per-head Triton decode, and without DeepGEMM the indexer falls back to torch (O(cap)).
* L40S (sm_89) and A100 (sm_80): sglang 0.5.23 calls FlashMLA for the DeepSeek-V4 decode, which is not built for them:
  there is no working stock decode path; the indexer is the torch fallback.

:data:`BASELINES` turns that into the ``baseline`` block of each GPU's calibration file; :data:`STATE_DESCRIPTIONS`
into each state's ``description``; :data:`FAST_PATH_NOT_MEASURED` into the ``reason`` of a projected file's
reference states (sglang's fast path was measured on the H200 only: FlashMLA has no sm_120 / sm_89 / sm_80 build).
"""

from __future__ import annotations

from sparsemla.ops.sim.calibration import BaselineInfo, GpuInfo

WGMMA = "wgmma (native Hopper code)"
SM89_PATH = "mma.sync (the sm_89 code path: what sm_80..sm_120 get)"

GPUS: dict[str, GpuInfo] = {
    "h200": GpuInfo("h200", "NVIDIA H200", "sm_90", 132, 4.8, WGMMA),
    "rtx-pro-6000": GpuInfo("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", "sm_120", 188, 1.79, SM89_PATH),
    "l40s": GpuInfo("l40s", "NVIDIA L40S", "sm_89", 142, 0.86, SM89_PATH),
    "a100": GpuInfo("a100", "NVIDIA A100 80GB", "sm_80", 108, 2.0, SM89_PATH),
}

FALLBACK_DECODE = "sglang 0.5.23's per-head Triton decode (flash_mla_sparse_decode_triton, flash_mla_sm120_triton.py)"
FALLBACK_INDEXER = (
    "sglang 0.5.23's torch indexer fallback (fp8_paged_mqa_logits_torch_sm120 + torch top-k over the page-table "
    "width, O(--context-length))"
)
FALLBACK = f"{FALLBACK_DECODE} + {FALLBACK_INDEXER}"

BASELINES: dict[str, BaselineInfo] = {
    "h200": BaselineInfo(
        label="sglang fallback (per-head Triton decode + torch indexer), not stock Hopper's FlashMLA + DeepGEMM",
        sglang_path=FALLBACK,
        sglang_default="FlashMLA (sgl-flash-mla) decode + DeepGEMM fp8_paged_mqa_logits indexer + sgl-kernel JIT top-k",
        models_default=False,
        note="Measured. The baseline state is sglang's fallback kernels (the path this project replaces on GPUs "
        "without a fast DeepSeek-V4 path), so flags-on speed-ups in this file are over that fallback. Stock Hopper's "
        "decode was measured in the same run as a reference state, not a simulator state: FlashMLA's decode with our "
        "indexer standing in for DeepGEMM's (not loadable under that run's torch 2.11); flags on were 0.98-1.02x of "
        "it per step (docs/performance.md, decode step).",
    ),
    "rtx-pro-6000": BaselineInfo(
        label="sglang SM120 fallback (SGLANG_SM120_FLASHMLA_BACKEND=triton + torch indexer), not the stock default",
        sglang_path=FALLBACK,
        sglang_default="FlashInfer SM120 sparse-MLA decode (SGLANG_SM120_FLASHMLA_BACKEND=flashinfer) + DeepGEMM sm120 "
        "fp8_paged_mqa_logits indexer + sgl-kernel JIT top-k",
        models_default=False,
        note="Projected. The baseline is the path sglang takes on sm_120 with SGLANG_SM120_FLASHMLA_BACKEND=triton and "
        "without DeepGEMM's sm120 kernel, because only those kernels were measured (on the H200). Stock sm_120 "
        "(FlashInfer SM120 decode + DeepGEMM sm120 indexer + JIT top-k) was never measured: this file does not say how "
        "much faster the flags are than that default.",
    ),
    "l40s": BaselineInfo(
        label="no working stock path; modelled as sglang's fallback kernels (per-head Triton decode + torch indexer)",
        sglang_path=FALLBACK,
        sglang_default="none: sglang 0.5.23 calls FlashMLA for the DeepSeek-V4 decode, which is not built for sm_89; "
        "indexer: the torch fallback; top-k: sgl-kernel JIT (if it builds)",
        models_default=False,
        note="Projected. Stock sglang 0.5.23 does not serve DeepSeek-V4 on sm_89 at all; the baseline models sglang's "
        "own fallback kernels as if sglang routed to them there (it does not), so that the A/B has a reference.",
    ),
    "a100": BaselineInfo(
        label="no working stock path; modelled as sglang's fallback kernels (per-head Triton decode + torch indexer)",
        sglang_path=FALLBACK,
        sglang_default="none: sglang 0.5.23 calls FlashMLA for the DeepSeek-V4 decode, which is not built for sm_80; "
        "indexer: the torch fallback; top-k: sgl-kernel JIT (if it builds)",
        models_default=False,
        note="Projected. Stock sglang 0.5.23 does not serve DeepSeek-V4 on sm_80 at all; the baseline models sglang's "
        "own fallback kernels as if sglang routed to them there (it does not). Our kernels run their bf16 variant on "
        "sm_80 (fp8 bytes dequantized with integer instructions, bf16 mma.sync), which was never measured: the sm_89 "
        "code path's times stand in for it.",
    ),
}


# Why a projected file has no numbers for the H200's reference state (FlashMLA's decode): it cannot run there, and
# whatever fast path sglang has on that GPU was never measured. Projecting FlashMLA's H200 times would be a guess.
FAST_PATH_NOT_MEASURED: dict[str, str] = {
    "rtx-pro-6000": "FlashMLA has no sm_120 build, and sglang's fast path on this GPU (FlashInfer's "
    "SM120 sparse-MLA decode + DeepGEMM's sm120 indexer + sgl-kernel JIT top-k) was never measured; the H200's "
    "FlashMLA times are not projected",
    "l40s": "FlashMLA has no sm_89 build and stock sglang 0.5.23 has no other DeepSeek-V4 decode on this "
    "GPU, so there is no fast path of sglang's here to compare with",
    "a100": "FlashMLA has no sm_80 build and stock sglang 0.5.23 has no other DeepSeek-V4 decode on this "
    "GPU, so there is no fast path of sglang's here to compare with",
}


def state_descriptions(gpu: str) -> dict[str, str]:
    """``description`` of each state on ``gpu``: which decode and which indexer it runs."""
    code = "wgmma, measured" if gpu == "h200" else "sm_89 code path, projected"
    decode, indexer = f"our Triton decode ({code})", f"our Triton indexer logits + top-k ({code})"
    return {
        "baseline": FALLBACK,
        "mma_decode": f"{decode} + {FALLBACK_INDEXER}",
        "triton_indexer": f"{FALLBACK_DECODE} + {indexer}",
        "mma_decode+triton_indexer": f"{decode} + {indexer}",
    }


def gpu_key_for_name(name: str) -> str | None:
    """The key of a GPU named as torch names it (``NVIDIA H200``), or None when the simulator has no entry for it."""
    wanted = name.strip().lower()
    return next((key for key, gpu in GPUS.items() if gpu.name.lower() == wanted), None)
