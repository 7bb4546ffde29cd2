"""Exploratory probe (no GPU): does Gluon's warp specialization compile for the mma.sync targets (sm_80, 86, 89, 120)?

A producer warpgroup stores [64, 64] bf16 tiles into two shared buffers behind Ampere mbarriers
(``gluon.language.nvidia.ampere.mbarrier``: ``full`` / ``empty``), four consumer warps multiply them with ``mma_v2``:
the shape of sm_90's warp-specialized decode tile (``sparse_decode/gluon_ws_sm90.py``) on mma.sync, the question
being whether the sm_89 code path could overlap its gather the same way.

    PYTHONPATH=src .venv/bin/python results/bench/explore/gluon_ampere_ws_probe.py            # Triton 3.8
    PYTHONPATH=/tmp/t36/site .venv/bin/python results/bench/explore/gluon_ampere_ws_probe.py  # Triton 3.6

Session 31: Triton 3.8 compiles it for all four targets without per-partition register counts (16,484 B); with a
count (96) LLVM aborts on ``setmaxnreg``, sm_90a's ("Cannot select: intrinsic %llvm.nvvm.setmaxnreg"). Triton 3.6
(the GPU machine's) takes only explicit counts: 96 aborts the same way, 0 fails in ConvertWarpSpecializeToLLVM. So a
warp-specialized mma.sync kernel would get no register split, and could run on the GPU machine only from Triton 3.8
cubins (benchmarks/prod_cubins.py), not from its own Triton.
"""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mbarrier, mma_v2

THREE_SIX = not triton.__version__.startswith("3.8")


@gluon.jit
def _consume(buf, full, empty, out, num_warps: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    acc = gl.zeros([64, 64], gl.float32, mma)
    for i in range(4):
        mbarrier.wait(full.index(i % 2), (i // 2) & 1)
        a = buf.index(i % 2).load(a_l)  # [64, 64] bf16
        b = buf.index(i % 2).permute((1, 0)).load(b_l)
        acc = mma_v2(a, b, acc)
        mbarrier.arrive(empty.index(i % 2))
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    o_c = gl.arange(0, 64, layout=gl.SliceLayout(0, mma))
    gl.store(out + o_r[:, None] * 64 + o_c[None, :], acc)


@gluon.jit
def _produce(buf, full, empty, x, PRODUCER_WARPS: gl.constexpr):
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    for i in range(4):
        mbarrier.wait(empty.index(i % 2), ((i // 2) & 1) ^ 1)
        buf.index(i % 2).store(gl.load(x + i * 4096 + o_r[:, None] * 64 + o_c[None, :]))  # [64, 64] bf16
        mbarrier.arrive(full.index(i % 2))


@gluon.jit
def _probe_kernel(x, out, REGS: gl.constexpr, num_warps: gl.constexpr):
    sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])
    buf = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], sl)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)  # Gluon's arrive: one elected thread per partition
        mbarrier.init(empty.index(i), count=1)
    if REGS > 0:  # the partitions' list inline: Gluon takes no local list of functions
        gl.warp_specialize([(_consume, (buf, full, empty, out, num_warps)), (_produce, (buf, full, empty, x, 4))], [4],
                           [REGS])  # fmt: skip
    else:
        gl.warp_specialize([(_consume, (buf, full, empty, out, num_warps)), (_produce, (buf, full, empty, x, 4))], [4])


def main() -> None:
    """Compile for each mma.sync target; ``argv[1]``: the producer's register count (default none; Triton 3.6 needs
    one). A count makes LLVM abort the process on these targets (setmaxnreg), as does Triton 3.6 with any."""
    regs = int(sys.argv[1]) if len(sys.argv) > 1 else (96 if THREE_SIX else 0)
    for cap in (80, 86, 89, 120):
        src = gluon._runtime.GluonASTSource(
            _probe_kernel, signature={"x": "*bf16", "out": "*fp32", "REGS": "constexpr", "num_warps": "constexpr"},
            constexprs={"REGS": regs, "num_warps": 4},
        )  # fmt: skip
        try:
            k = triton.compile(src, target=GPUTarget("cuda", cap, 32))
            print(f"Triton {triton.__version__} sm_{cap} producer regs {regs or '-'}: ok, {k.metadata.shared} B")
        except Exception as exc:  # noqa: BLE001 - a failing target is the finding
            last = (str(exc).strip().splitlines() or [repr(exc)])[-1][:160]
            print(f"Triton {triton.__version__} sm_{cap} producer regs {regs or '-'}: FAILS: {last}")


if __name__ == "__main__":
    main()
