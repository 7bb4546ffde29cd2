"""Exploratory A/B (not a benchmark claim): the indexer logits launch in its bf16 mode (DOT_BF16: what sm_80/86 run,
forced here) with ``LogitsConfig.opaque_bf16`` off and on, one code path per process, CUDA-graph replay.

    PYTHONPATH=/tmp/site:. python results/bench/explore/indexer_opaque_ab.py --path native --code SHA --out F
    TRITON_OVERRIDE_ARCH=sm89 PYTHONPATH=/tmp/site:. python results/bench/explore/indexer_opaque_ab.py --path sm89 ...

Every row: graph-replay median of the logits launch (do_bench, L2 flushed), the largest absolute difference of its
written logits against the fp8 mode's (the launcher's choice on this GPU), and the kernel's shared memory.
"""

import argparse
import json

import torch
import triton
from triton.testing import do_bench

from benchmarks.decode import graphed
from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels import aot
from sparsemla.kernels.indexer import triton as tri

p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
p.add_argument("--out", required=True)
p.add_argument("--code", default="")
p.add_argument("--shapes", default="1x4096,1x65536,64x4096,64x16384,64x65536", help="BxCTX,...")
p.add_argument("--cap", type=int, default=65536)
args = p.parse_args()

seen: dict[str, dict] = {}


def record(name: str, kernel) -> None:  # noqa: ANN001 - a CompiledKernel
    seen[name] = dict(smem=kernel.metadata.shared, regs=getattr(kernel, "n_regs", -1),
                      spills=getattr(kernel, "n_spills", -1))  # fmt: skip


dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
kv = gpu_indexer_cache(max(b for b, _ in shapes) * args.cap // 64 + 64, dev, gen)
rows = []
with aot.watch_launches(record):  # every launch records its kernel's shared memory, registers, spills
    for B, ctx in shapes:
        case = make_case(B, ctx, args.cap, kv, gen)
        fargs = (case.q, case.kv, case.weights, case.seq_lens, case.page_table)
        base = torch.full((B, args.cap), float("nan"), device=dev)
        tri._launch_logits(*fargs, base, args.cap)  # the launcher's own mode (fp8 MMAs on sm_89+)
        for opaque in (False, True):
            out = torch.full((B, args.cap), float("nan"), device=dev)
            kw = dict(dot_mode=tri.DOT_BF16, opaque_bf16=opaque)
            try:
                seen.clear()
                tri._launch_logits(*fargs, out, args.cap, **kw)
                diff = float((out[:, :ctx] - base[:, :ctx]).abs().max())
                call = graphed(lambda o=out, k=kw: tri._launch_logits(*fargs, o, args.cap, **k))
                us = do_bench(call, warmup=10, rep=50, return_mode="median") * 1e3
                rows.append(dict(path=args.path, B=B, ctx=ctx, opaque=opaque, us=round(us, 2), max_abs_diff_vs_fp8=diff,
                                 **seen.get("_indexer_logits_kernel", {})))  # fmt: skip
            except Exception as e:  # noqa: BLE001
                rows.append(dict(path=args.path, B=B, ctx=ctx, opaque=opaque, error=str(e).splitlines()[-1][:200]))
            print(json.dumps(rows[-1]), flush=True)
            doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "git_sha": args.code, "path": args.path, "rows": rows}  # fmt: skip
            json.dump(doc, open(args.out, "w"), indent=1)
