"""Exploratory (not a benchmark claim): programs per split row (``splits``) against the launcher's default, with
the two-pass filter off and at its default gate, on the H200, CUDA-graph replay of real indexer logits (cap
max(length, 65536)), k in {512, 2048}, position-ordered with page slots, vs torch.topk. Every row is checked
against the torch.topk set. Run: ``OUT=dir python results/bench/explore/topk_participants_sweep.py``; with ``--defaults``
the launcher's default (``default``) against the choice before ``topk_span`` (``old``: splits from 4096-position
spans, every participant's span at least 4096) at B in {1, 8, 64}, lengths 4k-256k."""

import json
import os
import subprocess
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from topk_filter_sweep import DEV, graph_us, same_set, torch_topk_row  # noqa: E402

from benchmarks.indexer import gpu_indexer_cache, make_case  # noqa: E402
from sparsemla.kernels import device as dev  # noqa: E402
from sparsemla.kernels.indexer import topk as tk  # noqa: E402
from sparsemla.kernels.indexer import triton as tri  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
DEFAULTS = "--defaults" in sys.argv


def old_splits(rows: int, n_cols: int, num_sms: int) -> int:
    """The launcher's split count before ``topk_span`` (4096-position spans, 4 programs per SM, at most 32)."""
    s = min(triton.cdiv(n_cols, 4096), max(num_sms * 4 // rows, 1), 32)
    return 1 if s < 2 else triton.next_power_of_2(s + 1) // 2


def main() -> None:
    gen = torch.Generator(device=DEV).manual_seed(0)
    kv = gpu_indexer_cache(64 * (262144 if DEFAULTS else 65536) // 64 + 64, DEV, gen)
    path = os.environ.get("TRITON_OVERRIDE_ARCH", "native")
    info = dev.device_info(DEV)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                git_sha=os.environ.get("GIT_SHA", sha), path=path, num_sms=info.num_sms,
                note="exploratory; working tree on top of git_sha; logits of random q/k; span=1024 so every "
                     "explicit split count is used in full")  # fmt: skip
    dest = os.path.join(OUT, f"topk_participants_{'defaults' if DEFAULTS else 'sweep'}-{path}.json")
    res = []
    for B in (64, 8, 1) if DEFAULTS else (64, 8):
        for ctx in (4096, 16384, 65536, 262144) if DEFAULTS else (4096, 16384, 65536):
            cap = max(ctx, 65536)
            c = make_case(B, ctx, cap, kv, gen)
            logits = tri.indexer_logits_fwd(c.q, c.kv, c.weights, c.seq_lens, c.page_table, c.cap)
            real = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
            pt = torch.randint(0, 1 << 20, (B, cap // 64), dtype=torch.int32, device=DEV, generator=gen)
            for k in (512, 2048):
                out = torch.empty(B, k, dtype=torch.int32, device=DEV)
                slots = torch.empty(B, k, dtype=torch.int32, device=DEV)
                variants = [("default", {})]
                if DEFAULTS:
                    variants.append(("old", dict(splits=old_splits(B, cap, info.num_sms), span=4096)))
                for s in () if DEFAULTS else (2, 4, 8, 16, 32):
                    variants.append((f"radix_s{s}", dict(splits=s, span=1024, filter_tiles=(0, 0))))
                    variants.append((f"gate_s{s}", dict(splits=s, span=1024)))
                for name, kw in variants:

                    def call(kw=kw):
                        return tk.indexer_topk_fwd(logits, real, k, out=out, page_table=pt, out_slots=slots,
                                                   sorted=False, **kw)  # fmt: skip

                    try:
                        us = graph_us(call)
                        row = dict(B=B, ctx=ctx, k=k, variant=name, us=round(us, 2),
                                   exact=same_set(out, logits, real, k),
                                   splits=kw.get("splits", tk.topk_splits(B, cap, info)),
                                   span=kw.get("span", tk.topk_span(B, tk.topk_splits(B, cap, info), info)))  # fmt: skip
                    except Exception as exc:  # noqa: BLE001
                        row = dict(B=B, ctx=ctx, k=k, variant=name, error=f"{type(exc).__name__}: {exc}"[:300])
                    res.append(row)
                    print(row, flush=True)
                    json.dump(dict(meta=meta, rows=res), open(dest, "w"), indent=1)
                res.append(torch_topk_row(B, ctx, k, logits))
    json.dump(dict(meta=meta, rows=res), open(dest, "w"), indent=1)


if __name__ == "__main__":
    main()
