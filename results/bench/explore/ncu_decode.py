"""Exploratory (not a benchmark claim): the V4 decode kernel under Nsight Compute, to see where its time goes in one
code path. Launches ``sparse_decode_fwd`` a few times at one shape; ``ncu_decode.sh`` profiles the third launch of
``_sparse_decode_kernel`` and exports the details and per-SASS-instruction source pages as CSV.

    PYTHONPATH=/tmp/site:. python results/bench/explore/ncu_decode.py --B 64 --H 64
"""

import argparse

import torch

from benchmarks.decode import Shape, make_inputs
from sparsemla.kernels import device as dev
from sparsemla.kernels.sparse_decode.triton import choose_config, sparse_decode_fwd

p = argparse.ArgumentParser()
p.add_argument("--B", type=int, default=64)
p.add_argument("--H", type=int, default=64)
p.add_argument("--swa", type=int, default=128)
p.add_argument("--extra", type=int, default=512)
p.add_argument("--launches", type=int, default=4)
args = p.parse_args()

kw = make_inputs(Shape(args.B, args.H, args.swa, args.extra), seed=0)
print("config", choose_config(dev.launch_info(torch.device("cuda")), args.H, args.B), flush=True)
for _ in range(args.launches):
    sparse_decode_fwd(**kw)
torch.cuda.synchronize()
print("done", flush=True)
