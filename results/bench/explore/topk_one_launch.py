"""Exploratory: one launch of the top-k kernel at one shape (real indexer logits, position order with page slots, the
launcher's default), from Triton 3.8 cubins when given -- a target for ``ncu`` (topk_ncu.sh), which profiles the
first ``_indexer_topk_kernel`` launch. Checks the output against torch.topk's set.

    PYTHONPATH=/tmp/site:. python results/bench/explore/topk_one_launch.py --cubins .gpu-cubins/wide --b 64 --ctx 16384
"""

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from topk_filter_sweep import DEV, same_set  # noqa: E402

from benchmarks.indexer import gpu_indexer_cache, make_case  # noqa: E402
from sparsemla.kernels.indexer import topk  # noqa: E402
from sparsemla.kernels.indexer import triton as tri  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--cubins", default="")
p.add_argument("--b", type=int, default=64)
p.add_argument("--ctx", type=int, default=16384)
p.add_argument("--k", type=int, default=2048)
args = p.parse_args()
CAP = 65536
replaying = contextlib.nullcontext({})
if args.cubins:
    from benchmarks import prod_cubins

    replaying = prod_cubins.replay(Path(args.cubins), {"_indexer_topk_kernel"})
gen = torch.Generator(device=DEV).manual_seed(0)
kv = gpu_indexer_cache(args.b * CAP // 64 + 64, DEV, gen)
case = make_case(args.b, args.ctx, CAP, kv, gen)
logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
out = torch.full((args.b, args.k), -7, dtype=torch.int32, device=DEV)
slots = torch.empty_like(out)
with replaying as replayed:
    topk.indexer_topk_fwd(logits, case.seq_lens, args.k, out=out, sorted=False, page_table=case.page_table,
                          out_slots=slots, page_size=64)  # fmt: skip
    torch.cuda.synchronize()
print(dict(exact=same_set(out, logits, case.seq_lens, args.k), replayed=replayed,
           launch=str(topk.choose_topk_launch(args.b, CAP, args.k, topk.dev.launch_info(logits.device)))))  # fmt: skip
