"""Exploratory A/B (not a benchmark claim): the digit width of the in-register radix search of
kernels/indexer/topk.py, one width for every launch (``RADIX_BITS`` and ``RADIX_BITS_WIDE_K`` both set; the runs of
2026-12-03 patched the one module constexpr the kernels had then, to the same effect; one width per process). Times
the top-k kernel alone (position order with page slots, what the sglang hooks call) and the fused logits + top-k
launch on real indexer logits, page-table width 65536, CUDA-graph replay (do_bench median, L2 flushed;
``us_graph20`` = 20 calls per graph); every output checked against the stable torch sort's set.

    PYTHONPATH=/tmp/site:. python results/bench/explore/topk_radix_bits_ab.py --bits 5 --path native --out F.json
"""

import argparse
import json
from pathlib import Path

import torch
import triton
from topk_filter_sweep import DEV, graph_us, same_set

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels.indexer import topk
from sparsemla.kernels.indexer import triton as tri

p = argparse.ArgumentParser()
p.add_argument("--bits", type=int, required=True)
p.add_argument("--path", required=True, help="native or sm89 (set TRITON_OVERRIDE_ARCH to match)")
p.add_argument("--out", required=True)
p.add_argument("--shapes", default="1x4096,64x4096,8x4096,64x1024,1x16384,64x16384")
p.add_argument("--fused", default="1x4096,64x4096")
p.add_argument("--ks", default="512,2048")
args = p.parse_args()
topk.RADIX_BITS = args.bits
topk.RADIX_BITS_WIDE_K = args.bits

CAP = 65536
gen = torch.Generator(device=DEV).manual_seed(0)
kv = gpu_indexer_cache(CAP + 64, DEV, gen)
rows = []


def record(**row):
    rows.append(dict(bits=args.bits, path=args.path, **row))
    print(json.dumps(rows[-1]), flush=True)
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, cap=CAP,
               rows=rows)  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=1))


for kind, shapes in (("topk", args.shapes), ("fused", args.fused)):
    for shape in filter(None, shapes.split(",")):
        b, ctx = (int(x) for x in shape.split("x"))
        case = make_case(b, ctx, CAP, kv, gen)
        logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
        for k in (int(x) for x in args.ks.split(",")):
            out = torch.full((b, k), -7, dtype=torch.int32, device=DEV)
            slots = torch.empty_like(out)
            if kind == "topk":

                def call(out=out, slots=slots, k=k, logits=logits, case=case):
                    topk.indexer_topk_fwd(logits, case.seq_lens, k, out=out, sorted=False,
                                          page_table=case.page_table, out_slots=slots, page_size=64)  # fmt: skip
            else:

                def call(out=out, k=k, case=case):
                    tri.indexer_logits_topk_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, k,
                                                CAP, out=out, sorted=False, fuse=True)  # fmt: skip

            call()
            torch.cuda.synchronize()
            exact = same_set(out, logits, case.seq_lens, k)
            record(kind=kind, B=b, ctx=ctx, k=k, exact=exact, us_graph=round(graph_us(call), 2),
                   us_graph20=round(graph_us(call, 20), 2))  # fmt: skip
