"""Exploratory (GPU): where the lifted integer dequant's decode output (DecodeConfig.q_lift) differs from the
conversion-unit path's, per tile kind, split count and q scale, on all-bytes caches (ext=1) and plain random ones.

    bash benchmarks/gpu-setup.sh; PYTHONPATH=/tmp/site:$PWD python3 results/bench/explore/lift_diag.py
    (and again under TRITON_OVERRIDE_ARCH=sm89)

Its run with the 2^60 lift (lift_diag-*-h200-2026-12-05.txt): only NoPE output values near 1e-27 differed (flushed
to zero once the accumulator sat 60 binades lower), so the lift became 2^8."""

import sys
from dataclasses import replace

import torch

sys.path.insert(0, "tests")
from test_sparse_decode_gpu import all_bytes_case, make_case  # noqa: E402

from sparsemla.kernels.sparse_decode import triton as T  # noqa: E402


def case(extreme: bool, qmul: float):
    if extreme:
        return all_bytes_case(77, qmul)
    kw = make_case(3, 64, 128, 512, sink=True, seed=77)
    kw["q"] = kw["q"] * qmul
    return kw


for extreme in (True, False):
    for qmul in (0.01, 1.0):
        kw = case(extreme, qmul)
        for dv, bh, bn, nw, st in ((1, 64, 16, 4, 2), (2, 64, 16, 4, 2), (1, 16, 16, 4, 1), (1, 32, 32, 4, 1)):
            for splits in (1, 3):
                base = T.DecodeConfig(bh, bn, nw, st, dv_split=dv)
                want = T.sparse_decode_fwd(**kw, num_splits=splits, config=base)
                for name, cfg in (
                    ("default", replace(base, int_dequant=True)),
                    ("lift", replace(base, int_dequant=True, q_lift=True)),
                    ("nolift", replace(base, int_dequant=True, q_lift=False)),
                ):
                    got = T.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
                    d = got[0].float() - want[0].float()
                    bad = d != 0
                    cols = bad.nonzero()[:, -1] if bad.any() else torch.tensor([])
                    lse_bad = int((got[1] != want[1]).sum())
                    print(
                        f"ext={int(extreme)} q*{qmul} {bh}x{bn} dv{dv} sp{splits} {name}: diff {int(bad.sum())}/"
                        f"{bad.numel()} max {d.abs().max().item():.2e} (|out| {want[0].float().abs().max():.2e}),"
                        f" nope cols {int((cols < 448).sum())} rope {int((cols >= 448).sum())}; lse diff {lse_bad}",
                        flush=True,
                    )
