"""Exploratory sweep (not a benchmark claim): decode tile configurations in one code path, CUDA-graph replay.

Run once per code path, each in its own process (TRITON_OVERRIDE_ARCH is read when Triton compiles):
    python portable_decode_sweep.py --path native --out $OUT/native.json
    TRITON_OVERRIDE_ARCH=sm89 python portable_decode_sweep.py --path sm89 --out $OUT/sm89.json
Configs are ``block_h:block_n:warps:stages:dv_split`` (bf16 partials and the integer dequant always on); every
(shape, config) row records the graph-replay median, the relative error against the fp32 reference and the compiled
kernel's ``metadata.shared``.
"""

import argparse
import json

import torch
import triton
from triton.testing import do_bench

from sparsemla.kernels.bench.decode import Shape, graphed, make_inputs
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
p.add_argument("--out", required=True)
p.add_argument("--configs", required=True, help="comma-separated bh:bn:w:st:dv[:splits]")
p.add_argument("--shapes", default="1x64,8x64,32x64,64x64,128x64", help="BxH,...")
p.add_argument("--extra", type=int, default=512)
args = p.parse_args()

shared: dict[str, int] = {}
real_run = triton.JITFunction.run


def run(self, *a, grid, warmup, **kw):
    k = real_run(self, *a, grid=grid, warmup=warmup, **kw)
    if k is not None and hasattr(k, "metadata"):
        shared[self.fn.__name__] = k.metadata.shared
    return k


triton.JITFunction.run = run
rows = []
for spec in args.shapes.split(","):
    B, H = (int(x) for x in spec.split("x"))
    shape = Shape(B, H, 128, args.extra)
    sets = [make_inputs(shape, seed=100 * B + i) for i in range(2)]
    ref = sparse_decode_reference(**sets[0])[0].float()
    for c in args.configs.split(","):
        bh, bn, w, st, dv, *rest = (int(x) for x in c.split(":"))
        cfg = T.DecodeConfig(bh, bn, w, st, dv_split=dv, partial_bf16=True, int_dequant=True)
        sp = rest[0] if rest else "auto"
        try:
            shared.clear()
            out = T.sparse_decode_fwd(**sets[0], config=cfg, num_splits=sp)[0].float()
            err = float((out - ref).norm() / ref.norm())
            smem = shared.get("_sparse_decode_kernel", -1)
            runs = [graphed(lambda kw=kw: T.sparse_decode_fwd(**kw, config=cfg, num_splits=sp)) for kw in sets]
            st_ = {"i": 0}

            def step(runs=runs, st_=st_):
                st_["i"] += 1
                return runs[st_["i"] % 2]()

            us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
            rows.append(dict(path=args.path, B=B, H=H, cfg=c, us=round(us, 2), err=err, smem=smem))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(path=args.path, B=B, H=H, cfg=c, error=str(e).splitlines()[-1][:200] if str(e) else repr(e)))
        print(json.dumps(rows[-1]), flush=True)
    del sets
    torch.cuda.empty_cache()
doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
json.dump(doc, open(args.out, "w"), indent=1)
