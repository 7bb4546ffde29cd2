"""Exploratory (not a benchmark claim): the top-k's two-pass filter path (strided-group maxima -> candidates ->
one register tile) against the split rows, per (GROUPS, CANDS) and loads in flight, on the H200, CUDA-graph replay
of real indexer logits (cap max(length, 65536)), k in {512, 2048}, position-ordered with page slots, vs torch.topk.
Every row is checked against the torch.topk set; tie-heavy rows (quantized, all-equal) check the fallback."""

import json
import os
import subprocess
import sys

import torch
import triton
from triton.testing import do_bench

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels import device as dev
from sparsemla.kernels.indexer import topk as tk
from sparsemla.kernels.indexer import triton as tri

OUT = os.environ.get("OUT", "/tmp")
DEV = torch.device("cuda")
QUICK = "--quick" in sys.argv


def graph_us(fn, n=1):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return do_bench(g.replay, warmup=10, rep=40, return_mode="median") * 1e3 / n


def same_set(out, logits, lens, k):
    for i in range(out.shape[0]):
        n = int(lens[i])
        order = torch.sort(logits[i, :n], descending=True, stable=True).indices  # ties -> smaller position
        ref = order[: min(k, n)].sort().values.to(torch.int32)
        got = out[i][out[i] >= 0].sort().values
        if not torch.equal(got, ref):
            return False
    return True


def torch_topk_row(B, ctx, k, logits):
    """The torch.topk row of a sweep (its real length, positions only), printed as it is taken."""
    sub = logits[:, :ctx]
    row = dict(B=B, ctx=ctx, k=k, variant="torch_topk",
               us=round(graph_us(lambda: torch.topk(sub, k, dim=1, sorted=False)), 2))  # fmt: skip
    print(row, flush=True)
    return row


def variants(k):
    v = [("split", dict(filter_tiles=(0, 0)))]
    if not QUICK:
        v.append(("stream1", dict(filter_tiles=(0, 0), splits=1)))
    grid = {512: [(2048, 2048), (2048, 1024), (1024, 1024), (4096, 2048)], 2048: [(4096, 4096), (4096, 8192)]}[k]
    for g, c in grid[:2]:
        v.append((f"splitfilter{g}/{c}", dict(filter_tiles=(g, c))))
    for g, c in grid[:1] if QUICK else grid:
        for unroll in (4,) if QUICK else (2, 4):
            v.append((f"filter{g}/{c}/u{unroll}", dict(filter_tiles=(g, c), splits=1, unroll=unroll)))
    return v


def main():
    gen = torch.Generator(device=DEV).manual_seed(0)
    kv = gpu_indexer_cache(64 * 262144 // 64 + 64, DEV, gen)
    path = os.environ.get("TRITON_OVERRIDE_ARCH", "native")
    info = dev.device_info(DEV)
    res = []
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                git_sha=os.environ.get("GIT_SHA", sha), path=path,
                note="exploratory; working tree on top of git_sha; logits of random q/k")  # fmt: skip
    dest = os.path.join(OUT, f"topk_filter_sweep-{path}.json")
    for B in (64, 1) if QUICK else (64, 8, 1):
        for ctx in (16384, 65536, 262144):
            cap = max(ctx, 65536)
            c = make_case(B, ctx, cap, kv, gen)
            logits = tri.indexer_logits_fwd(c.q, c.kv, c.weights, c.seq_lens, c.page_table, c.cap)
            real = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
            pt = torch.randint(0, 1 << 20, (B, cap // 64), dtype=torch.int32, device=DEV, generator=gen)
            hard = logits.clone()
            hard[0] = torch.round(hard[0] * 2) / 2  # heavy ties
            if B > 1:
                hard[1] = 0.5  # all equal: more candidates than CANDS -> the streaming fallback
            for k in (512, 2048):
                out = torch.empty(B, k, dtype=torch.int32, device=DEV)
                slots = torch.empty(B, k, dtype=torch.int32, device=DEV)
                for name, kw in variants(k):
                    kw = dict(kw)
                    tk.FILTER_UNROLL = kw.pop("unroll", 4)

                    def call(x=logits, kw=kw):
                        return tk.indexer_topk_fwd(x, real, k, out=out, page_table=pt, out_slots=slots,
                                                   sorted=False, **kw)  # fmt: skip

                    try:
                        us = graph_us(call)
                        exact = same_set(out, logits, real, k)
                        call(hard)
                        exact_hard = same_set(out, hard, real, k)
                        row = dict(B=B, ctx=ctx, k=k, variant=name, us=round(us, 2), exact=exact, exact_hard=exact_hard,
                                   splits=kw.get("splits", tk.topk_splits(B, cap, info)))  # fmt: skip
                    except Exception as exc:  # noqa: BLE001
                        row = dict(B=B, ctx=ctx, k=k, variant=name, error=f"{type(exc).__name__}: {exc}"[:300])
                    res.append(row)
                    print(row, flush=True)
                    json.dump(dict(meta=meta, rows=res), open(dest, "w"), indent=1)
                tk.FILTER_UNROLL = 4
                res.append(torch_topk_row(B, ctx, k, logits))
    json.dump(dict(meta=meta, rows=res), open(dest, "w"), indent=1)


if __name__ == "__main__":
    main()
