"""Exploratory (not a benchmark claim): one V3.2 decode launch at one shape under Nsight Compute -- the package's
call (its chosen tile: sm_90's prefetching Gluon tile from 16 programs on) replayed from Triton 3.8 cubins
(``--cubins``, benchmarks/prod_cubins.py), or FlashMLA's sparse fp8 decode as sglang calls it (``--flashmla``).
``ncu_decode_v32.sh`` profiles the third launch of the kernel and exports the details and per-SASS source pages.

    PYTHONPATH=/tmp/site:. python results/bench/explore/ncu_decode_v32.py --B 64 --H 128 --cubins .gpu-cubins/decode_v32
"""

import argparse
from pathlib import Path

import torch

from benchmarks.decode_v32 import Shape, flashmla_decode_call, make_inputs
from sparsemla.kernels import device as dev
from sparsemla.kernels.sparse_decode.triton_v32 import choose_v32_config, sparse_decode_v32_fwd

p = argparse.ArgumentParser()
p.add_argument("--B", type=int, default=64)
p.add_argument("--H", type=int, default=128)
p.add_argument("--cubins", type=Path, default=None)
p.add_argument("--flashmla", action="store_true")
p.add_argument("--launches", type=int, default=4)
args = p.parse_args()

kw = make_inputs(Shape(args.B, 1, args.H, 2048, "fp8_656", 8192), seed=0)
if args.flashmla:
    from benchmarks.decode import load_flash_mla

    flash_mla, why = load_flash_mla(kw["q"].device)
    assert flash_mla is not None, why
    run, _ = flashmla_decode_call(flash_mla, kw)
    for _ in range(args.launches):
        run()
else:
    from contextlib import nullcontext

    from benchmarks import prod_cubins

    print("config", choose_v32_config(dev.launch_info(kw["q"].device), args.H, args.B), flush=True)
    ctx = prod_cubins.Replayer(prod_cubins.path_dir(args.cubins, "native")) if args.cubins else nullcontext()
    with ctx:
        for _ in range(args.launches):
            sparse_decode_v32_fwd(kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"], kv_format="fp8_656", d_v=512)
torch.cuda.synchronize()
print("done", flush=True)
