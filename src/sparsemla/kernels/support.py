"""Can this GPU run the kernels? Checked when sglang starts with a kernel flag on, so an explicit flag that cannot be
honoured stops sglang at startup with the reason -- never at CUDA-graph capture, never a silent fallback."""

from __future__ import annotations

from sparsemla.kernels import device as dev

# The indexer's kernels (logits, fused logits + top-k, top-k) need at most this much shared memory per block on every
# target (ahead-of-time compile, Triton 3.8: 43,008 B for the fused kernel with fp8 MMAs, 51,200 B for the logits
# kernel with the bf16 MMAs of sm_80/86); tests/test_aot.py keeps it true.
INDEXER_SHARED_MAX = 53_248

# Shapes the decode selector is asked for (heads per rank x query rows): covers every branch of choose_config.
_DECODE_PROBES = [(h, r) for h in (8, 16, 64, 128) for r in (1, 2, 3, 6, 8, 64, 1024, 8192)]


def decode_shared_need(info: dev.DeviceInfo) -> int:
    """The most shared memory per block any decode configuration chosen for ``info`` needs."""
    from sparsemla.kernels.sparse_decode.triton import choose_config, shared_bytes

    return max(shared_bytes(choose_config(info, h, r), info) for h, r in _DECODE_PROBES)


# Flag of each op group, for the messages.
_FLAG_OF_OP = {"decode": "SPARSEMLA_MMA_DECODE", "indexer": "SPARSEMLA_TRITON_INDEXER", "dsa_v32": "SPARSEMLA_DSA_V32"}


def check_device(info: dev.DeviceInfo, ops: tuple[str, ...] = ("decode", "indexer")) -> None:
    """Raise :class:`~sparsemla.kernels.device.UnsupportedDevice` naming the GPU, what it lacks and what to do.

    ``dsa_v32`` (the DeepSeek-V3.2 decode and prefill kernels behind SPARSEMLA_DSA_V32) needs sm_80+ like the others;
    their launch configurations are chosen per target to fit its shared memory (``make aot`` compiles every one)."""
    where = f"{info.name or 'this GPU'} (sm_{info.arch}, {info.smem_per_block:,} B shared memory per block)"
    if not info.supported:
        named = ", ".join(_FLAG_OF_OP[op] for op in ops if op in _FLAG_OF_OP) or "the kernel flags"
        raise dev.UnsupportedDevice(
            f"{where}: the sparsemla kernels need sm_80 or newer (bf16 tensor-core MMAs); unset {named}"
        )
    needs = {}
    if "decode" in ops:
        needs["SPARSEMLA_MMA_DECODE"] = decode_shared_need(info)
    if "indexer" in ops:
        needs["SPARSEMLA_TRITON_INDEXER"] = INDEXER_SHARED_MAX
    short = {flag: need for flag, need in needs.items() if need > info.smem_per_block}
    if short:
        detail = ", ".join(f"{flag} needs {need:,} B" for flag, need in short.items())
        raise dev.UnsupportedDevice(f"{where}: {detail}; unset those flags")
