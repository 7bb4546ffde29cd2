"""Exploratory A/B (not a benchmark claim): the V4 decode kernel with and without ``OPAQUE_TILE`` (the gathered tile
passed through :func:`sparsemla.kernels.dequant.opaque_bf16`, so Triton lays the mma.sync operands out for bf16:
``ldmatrix``, one shared copy of the tile) in one code path per process, CUDA-graph replay, launcher's own config.

    PYTHONPATH=/tmp/site:. python results/bench/explore/opaque_tile_ab.py --path native --out F
    TRITON_OVERRIDE_ARCH=sm89 PYTHONPATH=/tmp/site:. python results/bench/explore/opaque_tile_ab.py --path sm89 --out F

The JSON of 2026-12-04 was written by this script's first version (commit 92acf60), which switched a module flag;
the launcher now takes ``DecodeConfig.opaque_tile``, which this version sets on the launcher's own configuration.

Every row: graph-replay median (2 input sets rotated, L2 flushed by do_bench), relative error of out against the fp32
reference (B <= 8) or against the other variant, and the kernel's shared memory, registers and spills.
"""

import argparse
import json
import subprocess
from dataclasses import replace

import torch
import triton
from triton.testing import do_bench

from benchmarks.decode import Shape, graphed, make_inputs
from sparsemla.kernels import device as dev
from sparsemla.kernels import aot
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

p = argparse.ArgumentParser()
p.add_argument("--path", required=True)
p.add_argument("--out", required=True)
p.add_argument("--shapes", default="1x64,8x64,32x64,64x64,128x64,64x8,64x16,1024x64", help="BxH,...")
p.add_argument("--extra", type=int, default=512)
p.add_argument("--git-sha", default="")
args = p.parse_args()

seen: dict[str, dict] = {}


def record(name: str, kernel) -> None:  # noqa: ANN001 - a CompiledKernel
    seen[name] = dict(smem=kernel.metadata.shared, regs=getattr(kernel, "n_regs", -1),
                      spills=getattr(kernel, "n_spills", -1))  # fmt: skip


rows = []
with aot.watch_launches(record):  # every launch records its kernel's shared memory, registers, spills
    for spec in args.shapes.split(","):
        B, H = (int(x) for x in spec.split("x"))
        sets = [make_inputs(Shape(B, H, 128, args.extra), seed=100 * B + i) for i in range(2)]
        ref = sparse_decode_reference(**sets[0])[0].float() if B <= 8 else None
        outs = {}
        auto = T.choose_config(dev.launch_info(torch.device("cuda")), H, B)
        for opaque in (False, True):
            cfg = replace(auto, opaque_tile=opaque)
            try:
                seen.clear()
                out = T.sparse_decode_fwd(**sets[0], config=cfg)[0].float()
                outs[opaque] = out
                base = ref if ref is not None else outs.get(not opaque, out)
                err = float((out - base).norm() / base.norm())
                res = seen.get("_sparse_decode_kernel", {})
                runs = [graphed(lambda kw=kw, cfg=cfg: T.sparse_decode_fwd(**kw, config=cfg)) for kw in sets]
                st = {"i": 0}

                def step(runs=runs, st=st):
                    st["i"] += 1
                    return runs[st["i"] % 2]()

                us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
                rows.append(dict(path=args.path, B=B, H=H, opaque=opaque, us=round(us, 2), err=err,
                                 err_vs="reference" if ref is not None else "other variant", **res))  # fmt: skip
            except Exception as e:  # noqa: BLE001
                msg = str(e).splitlines()[-1][:200] if str(e) else repr(e)
                rows.append(dict(path=args.path, B=B, H=H, opaque=opaque, error=msg))
            print(json.dumps(rows[-1]), flush=True)
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()  # fmt: skip
            doc = {"gpu": torch.cuda.get_device_name(), "driver": smi, "torch": torch.__version__,
                   "triton": triton.__version__, "git_sha": args.git_sha, "path": args.path, "rows": rows}  # fmt: skip
            json.dump(doc, open(args.out, "w"), indent=1)
        del sets
        torch.cuda.empty_cache()
