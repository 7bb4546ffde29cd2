"""Exploratory measurement (not a benchmark claim): the tensor-core ceiling of each code path on this GPU, for the
operand types the kernels use -- a plain Triton GEMM (fp32 accumulation) with fp8 e4m3 and with bf16 operands, the
best of a few tile configurations, M = N = K = 8192, CUDA-graph-free do_bench median (L2 flushed).

Run once per code path, each in its own process (TRITON_OVERRIDE_ARCH is read when Triton compiles):
    PYTHONPATH=/tmp/site:. python results/bench/explore/mma_ceiling.py --path native --out F
    TRITON_OVERRIDE_ARCH=sm89 PYTHONPATH=/tmp/site:. python results/bench/explore/mma_ceiling.py --path sm89 --out F
In the sm89 path the same GEMM lowers to mma.sync (the code sm_80..sm_89 and sm_120 get), so its TFLOP/s is the
ceiling an mma.sync kernel can reach on this GPU -- the yardstick for the kernels' sm_89-path times measured here.
"""

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _gemm_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """c [M, N] fp32 = a [M, K] @ b [K, N]; b is stored N-major ([N, K] contiguous, the K-major operand fp8 MMAs
    need); grouped program order for L2 reuse."""
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GROUP * n_n)
    first_m = group * GROUP
    size_m = min(n_m - first_m, GROUP)
    i_m = first_m + (pid % size_m)
    i_n = (pid % (GROUP * n_n)) // size_m
    o_m = (i_m * BM + tl.arange(0, BM)).to(tl.int64)
    o_n = (i_n * BN + tl.arange(0, BN)).to(tl.int64)
    o_k = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        b_a = tl.load(a + o_m[:, None] * K + (k0 + o_k)[None, :])  # [BM, BK]
        b_b = tl.load(b + o_n[None, :] * K + (k0 + o_k)[:, None])  # [BK, BN]
        acc = tl.dot(b_a, b_b, acc)
    tl.store(c + o_m[:, None] * N + o_n[None, :], acc)


p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
p.add_argument("--out", required=True)
p.add_argument("--size", type=int, default=8192)
args = p.parse_args()

n = args.size
rows = []


def sweep(dtype: torch.dtype, name: str) -> None:
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    c = torch.empty(n, n, device="cuda")
    ref = a[:256].float() @ b[:256].float().T
    for bm, bn, bk, warps, stages in ((128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3),
                                      (128, 128, 128, 8, 3), (64, 128, 128, 4, 4)):  # fmt: skip
        cfg = f"{bm}x{bn}x{bk}-w{warps}-s{stages}"
        grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)

        def call(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, grid=grid):
            _gemm_kernel[grid](a, b, c, n, n, n, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)

        try:
            call()
            err = float((c[:256, :256] - ref[:, :256]).norm() / ref[:, :256].norm())
            ms = do_bench(call, warmup=5, rep=100, return_mode="median")
            rows.append(dict(path=args.path, dtype=name, cfg=cfg, tflops=round(2 * n**3 / ms / 1e9, 1), err=err))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(path=args.path, dtype=name, cfg=cfg, error=str(e).splitlines()[-1][:160]))
        print(json.dumps(rows[-1]), flush=True)


sweep(torch.float8_e4m3fn, "fp8_e4m3")
sweep(torch.bfloat16, "bf16")
doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "size": n,
       "rows": rows}  # fmt: skip
json.dump(doc, open(args.out, "w"), indent=1)
