"""Exploratory (CPU, ahead of time, not a timing): would one program per 128 heads close the V3.2 decode's H = 128
gap to FlashMLA on sm_90? Today's wgmma tile is 64 heads x 64 tokens, so at H = 128 two programs gather and
dequantize the same 2,048 fp8 rows per query row (B = 64: 202 us against FlashMLA's 96, decode_v32_opaque-h200-*.json).
A 128-head tile dequantizes each row once; this compiles such tiles with Triton 3.8 for sm_90 at B = 64, H = 128,
fp8_656 and records shared memory, registers and spilled bytes per thread next to the chosen tile.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/v32_h128_tiles_aot.py --out F.json
"""

import argparse
import json
import subprocess
import time

import torch
import triton

from sparsemla.kernels import aot
from sparsemla.kernels import device as dev
from sparsemla.kernels.layouts import V32_DIM, V32_PAGE, v32_row_width
from sparsemla.kernels.sparse_decode import triton_v32 as v32

CANDIDATES = {  # name -> V32Config (partial_bf16 on, as every chosen tile)
    "64x64-w8-s3-c4 (chosen)": v32.V32Config(64, 64, 8, 3, True, nope_chunks=4),
    "64x64-w8-s3-c4-cvt": v32.V32Config(64, 64, 8, 3, True, False, nope_chunks=4),
    "128x32-w8-s2-c4": v32.V32Config(128, 32, 8, 2, True, nope_chunks=4),
    "128x32-w16-s2-c4": v32.V32Config(128, 32, 16, 2, True, nope_chunks=4),
    "128x64-w16-s2-c4": v32.V32Config(128, 64, 16, 2, True, nope_chunks=4),
}

p = argparse.ArgumentParser()
p.add_argument("--target", default="sm_90")
p.add_argument("--out", required=True)
args = p.parse_args()
info = dev.target(args.target)
rows = []
for name, cfg in CANDIDATES.items():
    records: list = []
    row = dict(config=name, target=args.target, B=64, H=128, kv_format="fp8_656", topk=2048)
    try:
        with aot.compile_only(args.target, info, name, records):
            kv = torch.empty(4, V32_PAGE, 1, v32_row_width("fp8_656"), dtype=torch.uint8)
            q = torch.empty(64, 1, 128, V32_DIM, dtype=torch.bfloat16)
            idx = torch.empty(64, 1, 2048, dtype=torch.int32)
            lens = torch.empty(64, dtype=torch.int32)
            v32.sparse_decode_v32_fwd(q, kv, idx, V32_DIM**-0.5, kv_format="fp8_656", topk_length=lens, config=cfg)
    except Exception as exc:  # noqa: BLE001 - the record keeps the compiler's reason
        row["error"] = str(exc).strip().splitlines()[-1][:300]
    for r in records:
        if r.kernel == "_sparse_decode_v32_kernel":
            row.update(shared_bytes=r.shared, registers=r.registers, spilled_bytes=r.spilled, num_warps=r.num_warps)
    print(json.dumps(row))
    rows.append(row)
sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
doc = dict(triton=triton.__version__, torch=torch.__version__, git_sha=sha, date=time.strftime("%Y-%m-%d"), rows=rows)
with open(args.out, "w") as f:
    json.dump(doc, f, indent=1)
