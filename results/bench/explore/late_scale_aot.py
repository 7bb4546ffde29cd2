"""Exploratory, CPU only (ahead of time, not a timing): what the V3.2 decode's loop costs per tile with K's fp32
scale applied late -- to the scores and to P (``V32Config.late_scale``) -- against the default, which scales every
gathered value. Each case on each target is compiled with the installed Triton for the launcher's tile; the loop's
instructions, the opcodes that change, registers, spills and shared memory are recorded.

The late scale lost on the H200 and was removed; this script runs at 6c92a05, the last commit with it.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/late_scale_aot.py --out F.json
"""

import argparse
import collections
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import triton

from sparsemla.kernels import aot
from sparsemla.kernels import device as dev
from sparsemla.kernels.sparse_decode import triton_v32 as v32

sys.path.insert(0, str(Path(__file__).parent))
from anatomy_lib import loop_body  # noqa: E402
from paging_prefetch_aot import _v32_call  # noqa: E402

CASES = [(64, 128), (64, 16), (8, 16)]  # B x H, fp8_656, 2048 indices
OPS = ("HMMA", "HGMMA", "FMUL", "FFMA", "IMAD", "PRMT", "F2FP", "LOP3", "SHF", "LDSM", "LDS", "STS")


def measure(target: str) -> list[dict]:
    info = dev.target(target)
    rows = []
    saved = v32.choose_v32_config
    try:
        for batch, heads in CASES:
            for late in (False, True):
                v32.choose_v32_config = lambda *a, late=late, **k: dataclasses.replace(saved(*a, **k), late_scale=late)
                got, recs = {}, []
                with (
                    aot.compile_only(target, info, f"B{batch} H{heads}", recs),
                    aot.watch_launches(lambda n, k, got=got: got.setdefault(n, k)),
                ):
                    _v32_call(batch, heads, "fp8_656")
                kernel = got["_sparse_decode_v32_kernel"]
                res = next(r for r in recs if r.kernel == "_sparse_decode_v32_kernel")
                ops = collections.Counter(op.split(".")[0] for op in loop_body(aot._cubin_tool(kernel.asm["cubin"],
                                                                                                 "-sass")))  # fmt: skip
                cfg = v32.choose_v32_config(info, heads, batch, "fp8_656")
                rows.append(dict(target=target, case=f"fp8 B{batch} H{heads}", config=dataclasses.asdict(cfg),
                                 late_scale=late, loop_instructions=sum(ops.values()),
                                 ops={o: ops.get(o, 0) for o in OPS}, registers=res.registers, spilled=res.spilled,
                                 shared=res.shared, ok=res.ok))  # fmt: skip
                print(target, rows[-1]["case"], "late" if late else "base", rows[-1]["loop_instructions"],
                      f"regs {res.registers} spill {res.spilled}", flush=True)  # fmt: skip
    finally:
        v32.choose_v32_config = saved
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--targets", default="sm_80,sm_89,sm_90,sm_100,sm_120")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = [r for t in args.targets.split(",") for r in measure(t)]
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(what=__doc__.split("\n\n")[0], triton=triton.__version__, git_sha=sha,
                date=time.strftime("%Y-%m-%d"), cases="B x H, fp8_656, top-k 2048, the launcher's tile")  # fmt: skip
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
