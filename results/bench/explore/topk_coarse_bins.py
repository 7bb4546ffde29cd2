"""Exploratory (CPU, not a timing): how many keys of real indexer logits fall in the threshold bin of a first radix
digit of 8, 11 or 12 bits (the sign-flipped order key's top bits) -- the candidates the coarse-digit selection of
split rows (topk._select_split_coarse, removed after its A/B at bec8b17: topk_coarse_ab-native-h200.json) gathered
into one tile of COARSE_CANDS[k] -- and how many lie above it.
Logits from benchmarks.indexer.make_case (fp8 keys ~ N(0, 1), random q and weights, as the GPU benchmarks use) by the
reference indexer; each length is a row prefix.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_coarse_bins.py --out F.json
"""

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from benchmarks.indexer import gpu_indexer_cache, make_case
from sparsemla.kernels.indexer.reference import indexer_logits_reference

COARSE_CANDS = {512: 2048, 1024: 2048, 2048: 4096}  # the removed selection's candidate tile per k

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=4)
p.add_argument("--lengths", default="4096,16384,65536,262144")
p.add_argument("--bits", default="8,11,12")
p.add_argument("--ks", default="512,2048")
p.add_argument("--keys", default="fp32,fp16", help="fp32: the kernels' 32-bit order key; fp16: the order key of the "
               "value rounded to fp16 (sign, 5 exponent, 6 mantissa bits in a 12-bit digit: sglang's coarse bin)")
p.add_argument("--out", required=True)
args = p.parse_args()
lengths = [int(x) for x in args.lengths.split(",")]
ctx = max(lengths)
gen = torch.Generator().manual_seed(0)
started = time.time()
case = make_case(args.rows, ctx, ctx, gpu_indexer_cache(args.rows * ctx // 64, torch.device("cpu"), gen), gen)
logits = indexer_logits_reference(case.q, case.kv, case.weights, case.seq_lens, case.page_table, max_seq_len=ctx)


def flipped(v: torch.Tensor) -> torch.Tensor:
    """Unsigned order of the float order as int64 (the kernels' sign-flipped order key)."""
    x = v.contiguous().view(torch.int32).to(torch.int64)
    x = torch.where(x == -(1 << 31), 0, x)
    x = torch.where(x < 0, x ^ 0x7FFFFFFF, x)  # negative floats: reverse their order
    return (x + (1 << 31)) & 0xFFFFFFFF


def flipped16(v: torch.Tensor) -> torch.Tensor:
    """Unsigned order of the value rounded to fp16 (-0 and +0 merged), as int64 in [0, 2**16)."""
    x = (v + 0.0).to(torch.float16).contiguous().view(torch.int16).to(torch.int64)
    x = torch.where(x == -(1 << 15), 0, x)
    x = torch.where(x < 0, x ^ 0x7FFF, x)
    return (x + (1 << 15)) & 0xFFFF


ORDER = {"fp32": (flipped, 32), "fp16": (flipped16, 16)}
rows = []
for r in range(args.rows):
    for n in lengths:
        for key_name in args.keys.split(","):
            order, width = ORDER[key_name]
            key = order(logits[r, :n])
            for k in (int(x) for x in args.ks.split(",")):
                kth = order(torch.topk(logits[r, :n], k).values[-1:])
                for bits in (int(x) for x in args.bits.split(",")):
                    digit, d = key >> (width - bits), int(kth >> (width - bits))
                    rows.append(dict(row=r, length=n, key=key_name, k=k, bits=bits, in_bin=int((digit == d).sum()),
                                     above=int((digit > d).sum()), cands_tile=COARSE_CANDS[k]))  # fmt: skip
sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
meta = dict(what=__doc__.split("\n\n")[0], git_sha=sha, torch=torch.__version__, rows=args.rows, seconds=round(time.time() - started))
Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
for n in lengths:
    for key_name in args.keys.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            line = [f"{n:>7} {key_name} k={k:<5}"]
            for bits in (int(x) for x in args.bits.split(",")):
                sel = [x["in_bin"] for x in rows if (x["length"], x["key"], x["k"], x["bits"]) == (n, key_name, k, bits)]
                line.append(f"{bits}-bit in-bin {min(sel)}-{max(sel)}")
            print("  ".join(line))
