"""Exploratory: indexer top-k register tiles vs streaming, CUDA-graph replay (not a benchmark claim)."""
import json, os
import torch
from triton.testing import do_bench
from sparsemla.kernels.bench.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels.indexer import triton as tri

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
kv = gpu_indexer_cache(64 * 16384 // 64 + 64, dev, gen)
def graph_us(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=5, rep=30, return_mode="median") * 1e3
res = []
cases = {(B, ctx): make_case(B, ctx, 65536, kv, gen) for B, ctx in ((1, 4096), (1, 16384), (64, 4096), (64, 16384))}
for tiles in ((4096, 16384), (4096, 4096), (2048, 2048), (1024, 1024)):
    tri.TOPK_ROW_TILES = tiles
    for (B, ctx), c in cases.items():
        args = (c.q, c.kv, c.weights, c.seq_lens, c.page_table)
        out = torch.empty(B, 512, dtype=torch.int32, device=dev)
        fused = graph_us(lambda: tri.indexer_logits_topk_fwd(*args, 512, c.cap, out=out))
        logits = tri.indexer_logits_fwd(*args, c.cap)
        out2 = torch.empty(B, 512, dtype=torch.int32, device=dev)
        topk = graph_us(lambda: tri.indexer_topk_fwd(logits, c.seq_lens, 512, out=out2))
        ok = bool(torch.equal(out, out2))
        res.append(dict(tiles=list(tiles), B=B, ctx=ctx, fused_graph_us=round(fused, 2), topk_only_graph_us=round(topk, 2), same=ok))
        print(f"tiles={tiles} B={B:3d} ctx={ctx:6d} fused {fused:8.2f} us  topk-only {topk:8.2f} us same={ok}", flush=True)
json.dump(res, open(os.path.join(OUT, "topk_explore.json"), "w"), indent=1)
