"""Exploratory, CPU only (ahead of time, not a timing): what the decode kernels' loop costs per tile with the slot ->
(page, row) split by shifts (``sparsemla.kernels.paging``, the default for power-of-two pages) against the division
it replaces, and what an L2 prefetch of a tile a few tiles ahead adds (``DecodeConfig`` / ``V32Config.l2_prefetch``,
off by default). Each case on each target is compiled with the installed Triton for the launcher's tile; the loop's
instructions, prefetches (``CCTL.E.PF2``), registers, spills and shared memory are recorded.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/paging_prefetch_aot.py --out F.json
"""

import argparse
import collections
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

from sparsemla.kernels import aot
from sparsemla.kernels import device as dev
from sparsemla.kernels.layouts import V32_DIM, V32_PAGE, v32_row_width
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode import triton_v32 as v32

sys.path.insert(0, str(Path(__file__).parent))
from anatomy_lib import loop_body  # noqa: E402

VARIANTS = {"divide": (False, 0, 128), "shift": (True, 0, 128), "shift-pf2": (True, 2, 128),
            "shift-pf3": (True, 3, 128), "shift-pf2s32": (True, 2, 32)}  # fmt: skip
V4_CASES = [(1, 64), (64, 64), (128, 128), (64, 8)]  # B x H, 128 + 512 indices
V32_CASES = [(64, 128, "fp8_656"), (64, 16, "fp8_656"), (64, 128, "bf16_576")]


@contextlib.contextmanager
def variant(shift: bool, ahead: int, stride: int):
    """The launchers with the page split by division (``shift`` False) and the prefetch fields set."""
    saved = T.page_shift, v32.page_shift, T.choose_config, v32.choose_v32_config
    if not shift:
        T.page_shift = v32.page_shift = lambda page_size: -1
    T.choose_config = lambda *a, **k: dataclasses.replace(saved[2](*a, **k), l2_prefetch=ahead, prefetch_stride=stride)
    v32.choose_v32_config = lambda *a, **k: dataclasses.replace(saved[3](*a, **k), l2_prefetch=ahead,
                                                                 prefetch_stride=stride)  # fmt: skip
    try:
        yield
    finally:
        T.page_shift, v32.page_shift, T.choose_config, v32.choose_v32_config = saved


def _v32_call(batch: int, heads: int, fmt: str) -> None:
    kv = torch.empty(4, V32_PAGE, 1, v32_row_width(fmt), dtype=torch.uint8 if fmt == "fp8_656" else torch.bfloat16)
    q = torch.empty(batch, 1, heads, V32_DIM, dtype=torch.bfloat16)
    idx, lens = torch.empty(batch, 1, 2048, dtype=torch.int32), torch.empty(batch, dtype=torch.int32)
    v32.sparse_decode_v32_fwd(q, kv, idx, V32_DIM**-0.5, kv_format=fmt, topk_length=lens)


def measure(target: str) -> list[dict]:
    info = dev.target(target)
    rows = []
    calls = [(f"v4 B{b} H{h}", "_sparse_decode_kernel", aot._decode_case(b, h, 512)) for b, h in V4_CASES]
    calls += [(f"v32 {f} B{b} H{h}", "_sparse_decode_v32_kernel", lambda b=b, h=h, f=f: _v32_call(b, h, f))
              for b, h, f in V32_CASES]  # fmt: skip
    for case, kernel, call in calls:
        for name, opts in VARIANTS.items():
            got, recs = {}, []
            with (
                variant(*opts),
                aot.compile_only(target, info, case, recs),
                aot.watch_launches(lambda n, k, got=got: got.setdefault(n, k)),
            ):
                call()
            res = next(r for r in recs if r.kernel == kernel)
            ops = collections.Counter(op.split(".")[0] for op in loop_body(aot._cubin_tool(got[kernel].asm["cubin"],
                                                                                             "-sass")))  # fmt: skip
            row = dict(target=target, case=case, variant=name, loop_instructions=sum(ops.values()),
                       prefetches=ops.get("CCTL", 0), registers=res.registers, spilled=res.spilled, shared=res.shared,
                       ok=res.ok)  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", action="append")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = [r for arch in args.arch or ["sm_89", "sm_90", "sm_120", "sm_80"] for r in measure(arch)]
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = dict(triton=triton.__version__, torch=torch.__version__, git_sha=sha, date=time.strftime("%Y-%m-%d"),
               what=__doc__.split("\n\n")[0], rows=rows)  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
