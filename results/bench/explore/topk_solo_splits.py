"""Exploratory sweep (not a benchmark claim): the split top-k's cost for rows that need no split, against the split
count. Rows of 4k (and 1k) real length in a 64k-wide page table, k = 512, position order with page slots, on real
indexer logits: the launcher's split count (``splits=None``), forced 1 / 2 / 4, and the same rows in a 4k-wide table
(``cap`` 4096: no split launch at all). CUDA-graph replay (do_bench median, L2 flushed; ``us_graph20`` = 20 calls per
graph); every output checked against the stable torch sort's set. Ran on the 5-bit-digit code before the solo
programs (work tree of 2026-12-03 on top of 7ebf455), where a row that needs one participant was selected by the
holder of its first start ticket.

    PYTHONPATH=/tmp/site:. python results/bench/explore/topk_solo_splits.py --out F.json

The JSON is the list of rows (NVIDIA H200, torch 2.11, Triton 3.6, the wgmma path).
"""

import argparse
import json

import torch
from topk_filter_sweep import DEV, graph_us, same_set

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels.indexer import topk
from sparsemla.kernels.indexer import triton as tri

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
args = p.parse_args()
CAP = 65536
gen = torch.Generator(device=DEV).manual_seed(0)
kv = gpu_indexer_cache(CAP + 64, DEV, gen)
rows = []
for b, ctx in ((64, 4096), (64, 1024), (32, 4096), (16, 4096), (128, 4096)):
    case = make_case(b, ctx, CAP, kv, gen)
    logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
    for splits in (None, 1, 2, 4):
        for cap in (CAP, 4096):
            if cap == 4096 and splits is not None:
                continue
            k = 512
            out = torch.full((b, k), -7, dtype=torch.int32, device=DEV)
            slots = torch.empty_like(out)
            lg = logits[:, :cap]

            def call(lg=lg, out=out, slots=slots, case=case, splits=splits, k=k):
                topk.indexer_topk_fwd(lg, case.seq_lens, k, out=out, sorted=False, page_table=case.page_table,
                                      out_slots=slots, page_size=64, splits=splits)  # fmt: skip

            call()
            torch.cuda.synchronize()
            r = dict(B=b, ctx=ctx, cap=cap, splits=splits, exact=same_set(out, logits, case.seq_lens, k),
                     us_graph=round(graph_us(call), 2), us_graph20=round(graph_us(call, 20), 2))  # fmt: skip
            rows.append(r)
            print(json.dumps(r), flush=True)
with open(args.out, "w") as f:
    json.dump(rows, f, indent=1)
