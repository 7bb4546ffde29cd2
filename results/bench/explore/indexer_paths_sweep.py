"""Exploratory sweep (not a benchmark claim): indexer logits launch parameters per code path, CUDA-graph replay,
H=64, cap 64k. The launch parameters were tuned on the wgmma path; this times them in the mma.sync code too.

    python results/bench/explore/indexer_paths_sweep.py --path native --out $OUT/native.json
    TRITON_OVERRIDE_ARCH=sm89 python results/bench/explore/indexer_paths_sweep.py --path sm89 --out $OUT/sm89.json

A config is ``default`` (choose_logits_config) or ``key=value/...`` overrides of LogitsConfig fields (block_n,
swap_ab, num_splits, num_warps, num_stages). Each row: graph-replay median, max abs error against the default
launch's logits, the kernel's ``metadata.shared``.
"""

import argparse
import json

import torch
import triton
from triton.testing import do_bench

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels.aot import watch_launches
from sparsemla.kernels.indexer.triton import _launch_logits

p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
p.add_argument("--out", required=True)
p.add_argument("--configs", required=True, help="comma-separated: default | k=v/k=v...")
p.add_argument("--shapes", default="64x4096,64x16384,64x65536,1x65536", help="BxCTX,...")
args = p.parse_args()

CAP = 65536
gen = torch.Generator(device="cuda").manual_seed(0)
kv = gpu_indexer_cache(64 * CAP // 64 + 64, torch.device("cuda"), gen)
shared: dict[str, int] = {}
rows = []


def parse(spec: str) -> dict:
    if spec == "default":
        return {}
    out = {}
    for kv_ in spec.split("/"):
        k, v = kv_.split("=")
        out[k] = v == "1" if k == "swap_ab" else int(v)
    return out


with watch_launches(lambda name, kernel: shared.__setitem__(name, kernel.metadata.shared)):
    for shape in args.shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        case = make_case(b, ctx, CAP, kv, gen)
        base = torch.empty(b, CAP, dtype=torch.float32, device="cuda")
        _launch_logits(case.q, case.kv, case.weights, case.seq_lens, case.page_table, base, CAP)
        for spec in args.configs.split(","):
            try:
                over = parse(spec)
                out = torch.empty_like(base)
                shared.clear()
                _launch_logits(case.q, case.kv, case.weights, case.seq_lens, case.page_table, out, CAP, **over)
                err = float((out[:, :ctx] - base[:, :ctx]).abs().max())
                graph = torch.cuda.CUDAGraph()
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    _launch_logits(case.q, case.kv, case.weights, case.seq_lens, case.page_table, out, CAP, **over)
                torch.cuda.current_stream().wait_stream(stream)
                with torch.cuda.graph(graph):
                    _launch_logits(case.q, case.kv, case.weights, case.seq_lens, case.page_table, out, CAP, **over)
                us = do_bench(graph.replay, warmup=10, rep=60, return_mode="median") * 1e3
                smem = max(shared.values()) if shared else -1
                rows.append(dict(path=args.path, B=b, ctx=ctx, cfg=spec, us=round(us, 2), err=err, smem=smem))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(path=args.path, B=b, ctx=ctx, cfg=spec, error=(str(e).splitlines() or [repr(e)])[-1][:200]))
            print(json.dumps(rows[-1]), flush=True)
doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__, "rows": rows}
json.dump(doc, open(args.out, "w"), indent=1)
