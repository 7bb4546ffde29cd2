"""Exploratory A/B (not a benchmark claim) of two versions of kernels/indexer/topk.py in one process: the old one
loaded from a copy (``--old``), the package's own, named by ``--labels``. First written for which participant of a
split launch selects a row that needs no split (rows of at most SPLIT_SPAN positions in a wide page table):
``part0``, participant 0 as at 0db0b06, against ``round``, the worker shifted by the row's round of ``num_sms``
tickets (bca4523). Real indexer logits, cap 65536, position order with page slots (what the sglang hooks call),
CUDA-graph replay (do_bench median, L2 flushed); every output checked against the torch.topk set.

    PYTHONPATH=/tmp/site:. python results/bench/explore/topk_worker_ab.py --old F --path native --out F.json
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from topk_filter_sweep import DEV, graph_us, same_set  # noqa: E402

from benchmarks.indexer import gpu_indexer_cache, make_case  # noqa: E402
from sparsemla.kernels.indexer import topk as new  # noqa: E402
from sparsemla.kernels.indexer import triton as tri  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--old", required=True)
p.add_argument("--path", required=True, help="native or sm89 (set TRITON_OVERRIDE_ARCH to match)")
p.add_argument("--out", required=True)
p.add_argument("--shapes", default="64x4096,64x1024,128x4096,8x4096,32x4096,64x16384")
p.add_argument("--ks", default="512,2048")
p.add_argument("--labels", default="part0,round", help="names of the old (--old) and the package's top-k")
args = p.parse_args()
spec = importlib.util.spec_from_file_location("topk_part0", args.old)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

CAP = 65536
gen = torch.Generator(device=DEV).manual_seed(0)
kv = gpu_indexer_cache(64 * CAP // 64 + 64, DEV, gen)
rows = []
for shape in args.shapes.split(","):
    b, ctx = (int(x) for x in shape.split("x"))
    case = make_case(b, ctx, CAP, kv, gen)
    logits = tri.indexer_logits_fwd(case.q, case.kv, case.weights, case.seq_lens, case.page_table, CAP, True)
    for k in (int(x) for x in args.ks.split(",")):
        for name, mod in zip(args.labels.split(","), (old, new), strict=True):
            out = torch.full((b, k), -7, dtype=torch.int32, device=DEV)
            slots = torch.empty_like(out)

            def call(mod=mod, out=out, slots=slots, k=k, logits=logits, case=case):
                mod.indexer_topk_fwd(logits, case.seq_lens, k, out=out, sorted=False, page_table=case.page_table,
                                     out_slots=slots, page_size=64)  # fmt: skip

            call()
            exact = same_set(out, logits, case.seq_lens, k)
            us = graph_us(call)
            rows.append(dict(B=b, ctx=ctx, k=k, variant=name, us=round(us, 2), exact=exact,
                             splits=new.topk_splits(b, CAP, new.dev.launch_info(DEV))))  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               path=args.path, cap=CAP, rows=rows)  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=1))
