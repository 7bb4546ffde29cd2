"""Exploratory sweep (not a benchmark claim): the V4 decode kernel's register prefetch of the next tile
(``DecodeConfig.prefetch``) against today's tiles, one code path per process, CUDA-graph replay.

    PYTHONPATH=/tmp/site:. python results/bench/explore/prefetch_decode_sweep.py --path native --configs ... --out F
    TRITON_OVERRIDE_ARCH=sm89 PYTHONPATH=/tmp/site:. python results/bench/explore/prefetch_decode_sweep.py --path sm89 ...

Configs are ``block_h:block_n:warps:stages:dv_split[:splits]`` with a trailing ``p`` for the prefetching loop (bf16
partials and the integer dequant always on); ``auto`` is the launcher's own choice. Every (shape, config) row records
the graph-replay median (2 input sets rotated, L2 flushed), the relative error against the fp32 reference, and the
compiled kernel's shared memory, registers and spills.
"""

import argparse
import json

import torch
import triton
from triton.testing import do_bench

from benchmarks.decode import Shape, graphed, make_inputs
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
p.add_argument("--out", required=True)
p.add_argument("--configs", required=True, help="comma-separated bh:bn:w:st:dv[:splits][p] or auto")
p.add_argument("--shapes", default="1x64,8x64,32x64,64x64,128x64", help="BxH,...")
p.add_argument("--extra", type=int, default=512)
args = p.parse_args()

seen: dict[str, dict] = {}
real_run = triton.JITFunction.run


def run(self, *a, grid, warmup, **kw):
    k = real_run(self, *a, grid=grid, warmup=warmup, **kw)
    if k is not None and hasattr(k, "metadata"):
        seen[self.fn.__name__] = dict(smem=k.metadata.shared, regs=getattr(k, "n_regs", -1),
                                      spills=getattr(k, "n_spills", -1))  # fmt: skip
    return k


triton.JITFunction.run = run
rows = []
for spec in args.shapes.split(","):
    B, H = (int(x) for x in spec.split("x"))
    shape = Shape(B, H, 128, args.extra)
    sets = [make_inputs(shape, seed=100 * B + i) for i in range(2)]
    ref = sparse_decode_reference(**sets[0])[0].float()
    for c in args.configs.split(","):
        if c == "auto":
            cfg, sp = None, "auto"
        else:
            pf = c.endswith("p")
            bh, bn, w, st, dv, *rest = (int(x) for x in c.rstrip("p").split(":"))
            cfg = T.DecodeConfig(bh, bn, w, st, dv_split=dv, partial_bf16=True, int_dequant=True, prefetch=pf)
            sp = rest[0] if rest else "auto"
        try:
            seen.clear()
            out = T.sparse_decode_fwd(**sets[0], config=cfg, num_splits=sp)[0].float()
            err = float((out - ref).norm() / ref.norm())
            res = seen.get("_sparse_decode_kernel", {})
            runs = [graphed(lambda kw=kw: T.sparse_decode_fwd(**kw, config=cfg, num_splits=sp)) for kw in sets]
            st_ = {"i": 0}

            def step(runs=runs, st_=st_):
                st_["i"] += 1
                return runs[st_["i"] % 2]()

            us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
            rows.append(dict(path=args.path, B=B, H=H, cfg=c, us=round(us, 2), err=err, **res))
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[-1][:200] if str(e) else repr(e)
            rows.append(dict(path=args.path, B=B, H=H, cfg=c, error=msg))
        print(json.dumps(rows[-1]), flush=True)
        doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "rows": rows}  # fmt: skip
        json.dump(doc, open(args.out, "w"), indent=1)
    del sets
    torch.cuda.empty_cache()
