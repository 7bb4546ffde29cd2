"""Exploratory (not a benchmark claim): where the single-program top-k spends its time on the H200, CUDA-graph replay.

Pieces timed on real indexer logits (cap 65536): an empty per-row kernel, a row load + 1 / 4 histograms in registers,
the packed int64 sort of K keys, the current top-k, torch.topk over the real length."""
import json
import os
import subprocess

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels.indexer import topk as tk
from sparsemla.kernels.indexer import triton as tri

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")


@triton.jit
def _empty(out_ptr):
    tl.store(out_ptr + tl.program_id(0), 1)


@triton.jit
def _hist(src, stride, out_ptr, ROW: tl.constexpr, PASSES: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, ROW)
    key = tk._order_key(tl.load(src + r * stride + o))
    acc = tl.zeros([256], dtype=tl.int32)
    pre = 0
    for p in tl.static_range(PASSES):
        digit = (key >> (24 - 8 * p)) & 255
        m = (key >> 24) != pre
        h = tl.histogram(digit, 256, mask=m)
        acc += h
        pre = tl.max(h, axis=0) & 1
    tl.store(out_ptr + r * 256 + tl.arange(0, 256), acc)


@triton.jit
def _sort(src, stride, out_ptr, K: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, K)
    v = tl.load(src + r * stride + o)
    packed = (tk._order_key(v).to(tl.int64) << 32) | (0x7FFFFFFF - o).to(tl.int64)
    packed = tl.sort(packed, descending=True)
    tl.store(out_ptr + r * K + o, 0x7FFFFFFF - packed.to(tl.int32))


def graph_us(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=10, rep=50, return_mode="median") * 1e3


def main():
    gen = torch.Generator(device=dev).manual_seed(0)
    kv = gpu_indexer_cache(64 * 65536 // 64 + 64, dev, gen)
    path = os.environ.get("TRITON_OVERRIDE_ARCH", "native")
    res = []
    for B in (1, 64):
        scratch = torch.empty(B * 4096, dtype=torch.int32, device=dev)
        res.append(dict(piece="empty", B=B, us=graph_us(lambda: _empty[(B,)](scratch))))
        for ctx in (4096, 16384, 65536):
            c = make_case(B, ctx, 65536, kv, gen)
            logits = tri.indexer_logits_fwd(c.q, c.kv, c.weights, c.seq_lens, c.page_table, c.cap)
            real = torch.full((B,), ctx, dtype=torch.int32, device=dev)  # every row at the real length
            for k in (512, 2048):
                out = torch.empty(B, k, dtype=torch.int32, device=dev)
                res.append(dict(piece="topk_now", B=B, ctx=ctx, k=k,
                                us=graph_us(lambda: tk.indexer_topk_fwd(logits, real, k, out=out))))
                if ctx == 4096:
                    res.append(dict(piece="sort_only", B=B, k=k, us=graph_us(
                        lambda: _sort[(B,)](logits, logits.stride(0), out, K=k, num_warps=8))))
                sub = logits[:, :ctx]
                res.append(dict(piece="torch_topk", B=B, ctx=ctx, k=k,
                                us=graph_us(lambda: torch.topk(sub, k, dim=1))))
            if ctx == 4096:
                for passes in (1, 4):
                    for warps in (4, 8, 16):
                        res.append(dict(piece=f"load_hist{passes}_w{warps}", B=B, ctx=ctx, us=graph_us(
                            lambda: _hist[(B,)](logits, logits.stride(0), scratch, ROW=4096, PASSES=passes,
                                                num_warps=warps))))
            # fused logits + top-k at this length
            for k in (512,):
                out = torch.empty(B, k, dtype=torch.int32, device=dev)
                args = (c.q, c.kv, c.weights, c.seq_lens, c.page_table)
                res.append(dict(piece="fused_now", B=B, ctx=ctx, k=k,
                                us=graph_us(lambda: tri.indexer_logits_topk_fwd(*args, k, c.cap, out=out))))
                res.append(dict(piece="logits_only", B=B, ctx=ctx,
                                us=graph_us(lambda: tri.indexer_logits_fwd(*args, c.cap))))
    for r in res:
        r["us"] = round(r["us"], 2)
        r["path"] = path
        print(r, flush=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, git_sha=sha,
                path=path, note="exploratory breakdown; logits of random q/k from the indexer kernel, cap 65536")
    json.dump(dict(meta=meta, rows=res), open(os.path.join(OUT, f"topk_breakdown-{path}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
