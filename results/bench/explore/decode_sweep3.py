"""Exploratory sweep 3 (not a benchmark claim): integer dequant vs conversion-unit dequant, new defaults."""
import json, os, dataclasses
import torch
from triton.testing import do_bench
from sparsemla.kernels.bench.decode import Shape, make_inputs, graphed
from sparsemla.kernels.sparse_decode import triton as T

OUT = os.environ.get("OUT", "/tmp")
res = []
def t_graph(calls):
    runs = [graphed(c) for c in calls]
    st = {"i": 0}
    def step():
        st["i"] += 1
        return runs[st["i"] % len(runs)]()
    return do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
D = dataclasses.replace
for H in (64, 128, 16):
    for B in ((1, 8, 32, 64, 128) if H == 64 else (1, 64)):
        sets = [make_inputs(Shape(B, H, 128, 512), seed=100 * B + i) for i in range(2)]
        base = T.default_config(H, B)
        ref = T.sparse_decode_fwd(**sets[0], config=D(base, partial_bf16=False))[0].float()
        cands = [("default", base), ("int_dequant", D(base, int_dequant=True))]
        if H == 64 and B == 32:
            cands.append(("default splits2", base))
        for name, cfg in cands:
            sp = 2 if "splits2" in name else "auto"
            out = T.sparse_decode_fwd(**sets[0], config=cfg, num_splits=sp)[0].float()
            err = float((out - ref).norm() / ref.norm())
            us = t_graph([lambda kw=kw, cfg=cfg, sp=sp: T.sparse_decode_fwd(**kw, config=cfg, num_splits=sp) for kw in sets])
            res.append(dict(H=H, B=B, cfg=name, us=round(us, 2), err=err))
            print(f"H={H:3d} B={B:4d} {name:16s} {us:8.2f} us err_vs_fp32part={err:.1e} {cfg}", flush=True)
        del sets
        torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "sweep3.json"), "w"), indent=1)
