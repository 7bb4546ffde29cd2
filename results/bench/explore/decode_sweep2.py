"""Exploratory sweep 2 (not a benchmark claim): fused split merge / bf16 partials, kernel-time breakdown."""
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
    return do_bench(step, warmup=10, rep=40, return_mode="median") * 1e3, runs

def breakdown(run):
    from torch.profiler import profile, ProfilerActivity
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            cache.zero_()
            run()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "decode" in e.key or "combine" in e.key:
            out[e.key[:40]] = round(e.device_time / max(e.count, 1) if hasattr(e, "device_time") else e.cuda_time / max(e.count, 1), 2)
    return out

D = dataclasses.replace
for B in (1, 8, 32, 64, 128):
    sets = [make_inputs(Shape(B, 64, 128, 512), seed=100 * B + i) for i in range(2)]
    base = T.default_config(64, B)
    ref = T.sparse_decode_fwd(**sets[0])[0].float()
    tiles = -(-128 // base.block_n) + -(-512 // base.block_n)
    auto = T.choose_num_splits(B, 1, tiles, 132)
    cands = [("base", base, auto)]
    for sp in sorted({auto, max(2, auto // 2), 2, 4}):
        if 1 < sp <= 16:
            cands.append(("fused", D(base, fuse_merge_max_splits=16), sp))
            cands.append(("fused bf16", D(base, fuse_merge_max_splits=16, partial_bf16=True), sp))
    cands.append(("bf16", D(base, partial_bf16=True), auto))
    if B <= 8:
        c5 = T.DecodeConfig(64, 16, 4, 2, "wide", 2)
        cands += [("dv2 16:4:2", c5, "auto"), ("dv2 16:4:2 bf16", D(c5, partial_bf16=True), "auto")]
        c32 = T.DecodeConfig(64, 32, 8, 1)
        for sp in (4, 8, 10, 16):
            cands.append(("32:8:1 fused", D(c32, fuse_merge_max_splits=16), sp))
        c64 = T.DecodeConfig(64, 64, 8, 1)
        for sp in (4, 8, 10):
            cands.append(("64:8:1 fused", D(c64, fuse_merge_max_splits=16), sp))
    for name, cfg, sp in cands:
        try:
            out = T.sparse_decode_fwd(**sets[0], num_splits=sp, config=cfg)[0].float()
            err = float((out - ref).norm() / ref.norm())
            us, runs = t_graph([lambda kw=kw, cfg=cfg, sp=sp: T.sparse_decode_fwd(**kw, num_splits=sp, config=cfg) for kw in sets])
            bd = breakdown(runs[0]) if name in ("base", "fused") else {}
            out2 = T.sparse_decode_fwd(**sets[0], num_splits=sp, config=cfg)[0].float()
            det = bool(torch.equal(out, out2))
        except Exception as e:  # noqa
            print(B, name, sp, "FAILED", type(e).__name__, str(e)[:300], flush=True)
            continue
        res.append(dict(B=B, cfg=name, splits=sp, us=round(us, 2), err=err, det=det, kernels=bd))
        print(f"B={B:4d} {name:18s} splits={sp!s:5s} {us:8.2f} us err={err:.1e} det={det} {bd}", flush=True)
    del sets
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "sweep2.json"), "w"), indent=1)
