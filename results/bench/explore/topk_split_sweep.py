"""Exploratory (not a benchmark claim): the split top-k's span and split count on the H200, CUDA-graph replay of
real indexer logits (cap 65536), k in {512, 2048}, sorted and position-ordered, against torch.topk."""

import json
import os
import subprocess

import torch
import triton
from triton.testing import do_bench

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels import device as dev
from sparsemla.kernels.indexer import topk as tk
from sparsemla.kernels.indexer import triton as tri

OUT = os.environ.get("OUT", "/tmp")
DEV = torch.device("cuda")


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
    return do_bench(g.replay, warmup=10, rep=50, return_mode="median") * 1e3 / n


def main():
    gen = torch.Generator(device=DEV).manual_seed(0)
    kv = gpu_indexer_cache(64 * 65536 // 64 + 64, DEV, gen)
    path = os.environ.get("TRITON_OVERRIDE_ARCH", "native")
    info = dev.device_info(DEV)
    res = []
    for B in (1, 64):
        for ctx in (4096, 16384, 65536):
            c = make_case(B, ctx, 65536, kv, gen)
            logits = tri.indexer_logits_fwd(c.q, c.kv, c.weights, c.seq_lens, c.page_table, c.cap)
            real = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
            ref = torch.topk(logits[:, :ctx], 512, dim=1).indices.sort(dim=1).values.to(torch.int32)
            for k in (512, 2048):
                out = torch.empty(B, k, dtype=torch.int32, device=DEV)
                auto = tk.topk_splits(B, 65536, info)
                for splits in sorted({1, auto}):
                    for span in (4096,):
                        for srt in (False, True):
                            us = graph_us(
                                lambda: tk.indexer_topk_fwd(
                                    logits, real, k, out=out, sorted=srt, splits=splits, span=span
                                )
                            )
                            row = dict(
                                B=B,
                                ctx=ctx,
                                k=k,
                                splits=splits,
                                span=span,
                                sorted=srt,
                                auto=splits == auto,
                                us=round(us, 2),
                            )
                            if k == 512 and not srt:
                                row["exact"] = bool(torch.equal(out, ref))
                            if splits == auto and span == 4096:
                                row["us_in_graph_of_20"] = round(
                                    graph_us(lambda: tk.indexer_topk_fwd(logits, real, k, out=out, sorted=srt), n=20), 2
                                )
                            res.append(row)
                            print(row, flush=True)
                sub = logits[:, :ctx]
                res.append(
                    dict(
                        B=B,
                        ctx=ctx,
                        k=k,
                        provider="torch_topk",
                        us=round(graph_us(lambda: torch.topk(sub, k, dim=1, sorted=False)), 2),
                    )
                )
                print(res[-1], flush=True)
            args = (c.q, c.kv, c.weights, c.seq_lens, c.page_table)
            out = torch.empty(B, 512, dtype=torch.int32, device=DEV)
            for fuse in (True, False):
                for srt in (False, True):
                    res.append(
                        dict(
                            B=B,
                            ctx=ctx,
                            k=512,
                            provider="logits+topk",
                            fuse=fuse,
                            sorted=srt,
                            us=round(
                                graph_us(
                                    lambda: tri.indexer_logits_topk_fwd(
                                        *args, 512, c.cap, out=out, sorted=srt, fuse=fuse
                                    )
                                ),
                                2,
                            ),
                        )
                    )
                    print(res[-1], flush=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        git_sha=sha,
        path=path,
        note="exploratory; working tree on top of git_sha; logits of random q/k, cap 65536",
    )
    json.dump(dict(meta=meta, rows=res), open(os.path.join(OUT, f"topk_split_sweep-{path}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
