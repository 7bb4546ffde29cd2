"""Exploratory sweep (not a benchmark claim): decode kernel variants and indexer logits launch params, graph replay."""
import json, os, sys, time
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
    return do_bench(step, warmup=10, rep=40, return_mode="median") * 1e3

CFGS = {
    "c0 64:64:8:1": T.DecodeConfig(64, 64, 8, 1),
    "c1 64:16:8:2": T.DecodeConfig(64, 16, 8, 2),
    "c2 64:64:8:1 cg": T.DecodeConfig(64, 64, 8, 1, "wide", 1, ".cg"),
    "c3 64:64:8:2": T.DecodeConfig(64, 64, 8, 2),
    "c4 64:32:4:1 dv2": T.DecodeConfig(64, 32, 4, 1, "wide", 2),
    "c5 64:16:4:2 dv2": T.DecodeConfig(64, 16, 4, 2, "wide", 2),
    "c6 64:64:8:1 dv2": T.DecodeConfig(64, 64, 8, 1, "wide", 2),
    "c7 64:32:8:2 dv2": T.DecodeConfig(64, 32, 8, 2, "wide", 2),
    "c8 64:16:8:2 cg": T.DecodeConfig(64, 16, 8, 2, "wide", 1, ".cg"),
    "c9 64:32:4:2 dv2 cg": T.DecodeConfig(64, 32, 4, 2, "wide", 2, ".cg"),
    "c10 64:32:8:1": T.DecodeConfig(64, 32, 8, 1),
}
which = sys.argv[1] if len(sys.argv) > 1 else "decode,indexer"
if "decode" in which:
    for B in (1, 8, 32, 64, 128):
        sets = [make_inputs(Shape(B, 64, 128, 512), seed=100 * B + i) for i in range(2)]
        ref = T.sparse_decode_fwd(**sets[0])[0].float()
        line = [f"B={B:4d}"]
        for name, cfg in CFGS.items():
            head_blocks = 1
            tiles = -(-128 // cfg.block_n) + -(-512 // cfg.block_n)
            auto = T.choose_num_splits(B, cfg.dv_split, tiles, 132)
            for splits in sorted({auto, max(1, auto // 2), min(tiles, auto * 2)}):
                try:
                    out = T.sparse_decode_fwd(**sets[0], num_splits=splits, config=cfg)[0].float()
                    err = float((out - ref).norm() / ref.norm())
                    us = t_graph([lambda kw=kw: T.sparse_decode_fwd(**kw, num_splits=splits, config=cfg) for kw in sets])
                except Exception as e:  # noqa
                    print(B, name, splits, "FAILED", type(e).__name__, str(e)[:200], flush=True)
                    continue
                res.append(dict(op="decode", B=B, cfg=name, splits=splits, auto=splits == auto, us=round(us, 2), err=err))
                print(f"B={B:4d} {name:22s} splits={splits:3d}{'*' if splits == auto else ' '} {us:8.2f} us err={err:.1e}", flush=True)
        del sets
        torch.cuda.empty_cache()
if "indexer" in which:
    from sparsemla.kernels.bench.indexer import gpu_indexer_cache, make_case
    from sparsemla.kernels.indexer.triton import _launch_logits, num_splits_for
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = torch.device("cuda")
    kv = gpu_indexer_cache(64 * 65536 // 64 + 64, dev, gen)
    for (B, ctx) in ((1, 4096), (64, 4096), (64, 16384), (64, 65536)):
        case = make_case(B, ctx, 65536, kv, gen)
        out = torch.empty(B, case.cap, dtype=torch.float32, device=dev)
        args = (case.q, case.kv, case.weights, case.seq_lens, case.page_table, out, case.cap)
        _launch_logits(*args); ref = out[:, :ctx].clone()
        best = None
        for block_n in (64, 128):
            for stages in (2, 3, 4, 5, 6):
                for warps in (4, 8):
                    for per_sm in (1, 2, 4, 8, 16):
                        kw = dict(block_n=block_n, num_stages=stages, num_warps=warps, num_splits=num_splits_for(B, dev, programs_per_sm=per_sm))
                        try:
                            out.fill_(float("nan")); _launch_logits(*args, **kw)
                            ok = torch.allclose(out[:, :ctx], ref, rtol=1e-4, atol=1e-4)
                            g = torch.cuda.CUDAGraph()
                            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
                            with torch.cuda.stream(s):
                                _launch_logits(*args, **kw)
                            torch.cuda.current_stream().wait_stream(s)
                            with torch.cuda.graph(g):
                                _launch_logits(*args, **kw)
                            us = do_bench(g.replay, warmup=5, rep=25, return_mode="median") * 1e3
                        except Exception as e:  # noqa
                            print("idx", B, ctx, kw, "FAILED", type(e).__name__, flush=True)
                            continue
                        res.append(dict(op="indexer", B=B, ctx=ctx, us=round(us, 2), ok=ok, **kw, per_sm=per_sm))
                        if best is None or us < best[0]:
                            best = (us, block_n, stages, warps, per_sm, ok)
        default = [r for r in res if r["op"] == "indexer" and r["B"] == B and r["ctx"] == ctx and r["block_n"] == 128 and r["num_stages"] == 3 and r["num_warps"] == 4 and r["per_sm"] == 8]
        print(f"indexer B={B} ctx={ctx}: best {best}; default(128,3,4,8) {default[0]['us'] if default else None}", flush=True)
        top = sorted([r for r in res if r["op"] == "indexer" and r["B"] == B and r["ctx"] == ctx], key=lambda r: r["us"])[:6]
        for r in top: print("   ", r["us"], r["block_n"], r["num_stages"], r["num_warps"], r["per_sm"], r["ok"])
json.dump(res, open(os.path.join(OUT, f"sweep-{which.replace(',', '_')}.json"), "w"), indent=1)
