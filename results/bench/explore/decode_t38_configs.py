"""Exploratory A/B (not a benchmark claim): V4 decode launch configurations compiled by Triton 3.8 (production) for
sm_90, timed on the H200 from their cubins (benchmarks/prod_cubins.py) next to the same configurations compiled by the
GPU machine's Triton 3.6. Why: 3.8's wgmma kernel at the 64-head x 64-token tile spills 88 B per thread ahead of time
(3.6: 8 B) and its graph replay took 68 us at B = 64, H = 64 against 3.6's 46 (decode_t38-native-h200-2026-12-03.json).

    # here (Triton 3.8, no GPU): cubins of every (shape, config) launch, and each config's registers / spills
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/decode_t38_configs.py --build-cubins .gpu-cubins/dcfg
    # GPU machine: carry .gpu-cubins
    PYTHONPATH=/tmp/site:. python results/bench/explore/decode_t38_configs.py --cubins .gpu-cubins/dcfg --out F.json

Configs are ``block_h:block_n:warps:stages:dv_split`` (bf16 partials and the integer dequant on; a trailing ``c``
builds the gathered tile chunks-first, DecodeConfig.chunks_first), ``gluon`` (sm_90's Gluon tile) or ``auto`` (the
launcher's own choice). Every
row: CUDA-graph replay median (2 input sets rotated, L2 flushed) for Triton 3.8 cubins
and Triton 3.6, and the relative error of the 3.8 output against the fp32 reference.
"""

import argparse
import contextlib
import gzip
import json
import sys
from pathlib import Path

import torch
import triton

from benchmarks.decode import Shape, graphed, make_inputs
from sparsemla.kernels.sparse_decode import triton as T

p = argparse.ArgumentParser()
p.add_argument("--build-cubins", default="", help="no GPU: compile every launch with this Triton (3.8) into DIR")
p.add_argument("--cubins", default="", help="GPU: time each config from DIR's Triton 3.8 cubins and with Triton 3.6")
p.add_argument("--out", default="")
p.add_argument("--code", default="", help="what the package's code is (the GPU copy has no .git)")
p.add_argument("--configs", default="auto,64:64:8:1:1,64:32:8:1:1,64:64:8:1:2,64:32:8:2:1,64:32:4:1:2,64:16:4:2:2")
p.add_argument("--shapes", default="8x64,32x64,64x64,128x64,8x128,32x128,64x128,128x128", help="BxH,...")
p.add_argument("--extra", type=int, default=512)
p.add_argument(
    "--extra-valid",
    default="",
    help="GPU: comma-separated valid lengths of the extra list (the rest of its width -1, as sglang's ratio-128 "
    "page-index table is at contexts below its capacity); each is a row set of its own (rows' extra_valid)",
)
p.add_argument("--only-t38", action="store_true", help="GPU: skip the Triton 3.6 rows (their compiles take minutes)")
p.add_argument(
    "--occupancy-of",
    default="",
    help="GPU: also time each config's 3.8 cubins with that target's blocks per SM (prod_cubins.padded_shared) and "
    "its shared memory per SM in the launcher's split count, on the H200's SMs (rows us_t38occ)",
)
p.add_argument(
    "--path",
    default="native",
    help="code path: native, or sm89 (build here; on the GPU run the script "
    "under TRITON_OVERRIDE_ARCH=sm89, whose Triton 3.6 rows are then that path's too)",
)
args = p.parse_args()

SHAPES = [Shape(*(int(x) for x in s.split("x")), 128, args.extra) for s in args.shapes.split(",")]
CONFIGS = args.configs.split(",")


def splits(spec: str) -> int | str:
    """``.../sN``: N splits instead of the launcher's count."""
    return int(spec.split("/s")[1]) if "/s" in spec else "auto"


def config(spec: str) -> T.DecodeConfig | None:
    spec = spec.split("/s")[0]
    if spec == "auto":
        return None
    if spec.startswith("gluon"):  # sm_90's Gluon tile as the launcher builds it (bf16 partials: the launches timed
        # here); gluon-sync / gluon-ws: without / with its producer warpgroup whatever the tiles per program
        ws = {"gluon": None, "gluon-sync": False, "gluon-ws": True}[spec]
        return T.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, gluon=True, chunks_first=True,
                              warp_specialize=ws)  # fmt: skip
    bh, bn, w, st, dv = (int(x) for x in spec.rstrip("c").split(":"))
    return T.DecodeConfig(bh, bn, w, st, dv_split=dv, partial_bf16=True, int_dequant=True,
                          chunks_first=spec.endswith("c"))  # fmt: skip


if args.build_cubins:
    from benchmarks import prod_cubins
    from sparsemla.kernels import aot
    from sparsemla.kernels import device as dev

    out_dir = Path(args.build_cubins)
    for spec in CONFIGS:

        def workload(spec: str = spec) -> None:
            for shape in SHAPES:
                kw = make_inputs(shape, 0, "cpu", fill=False)
                T.sparse_decode_fwd(**kw, config=config(spec), num_splits=splits(spec))
                if args.occupancy_of:  # the launches the occupancy-matched rows make (the target's split counts)
                    sms = prod_cubins.path_info(args.path)[0].num_sms
                    with dev.assume(prod_cubins.occupancy_facts(dev.target(args.occupancy_of), sms)):
                        T.sparse_decode_fwd(**kw, config=config(spec), num_splits=splits(spec))

        added = prod_cubins.build(workload, out_dir, args.path)
        for entry in added:
            if entry["name"].startswith("_sparse_decode_kernel"):
                regs, spill = aot.cubin_resources(gzip.decompress((out_dir / entry["cubin"]).read_bytes()))
                print(f"{spec:>14}: {entry['name']} shared {entry['shared']} B, {regs} regs, spill {spill} B")
    print(f"Triton {triton.__version__}: {out_dir}")
    sys.exit(0)
if not (args.cubins and args.out):
    sys.exit("--cubins DIR and --out F are required on the GPU (or --build-cubins DIR here)")

from triton.testing import do_bench  # noqa: E402

from benchmarks import prod_cubins  # noqa: E402
from sparsemla.kernels import device as dev  # noqa: E402
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference  # noqa: E402

replayer = prod_cubins.Replayer(Path(args.cubins))
occ_replayer, occ_info = None, None
if args.occupancy_of:
    occ_target = dev.target(args.occupancy_of)
    occ_replayer = prod_cubins.Replayer(Path(args.cubins), occupancy_of=occ_target)
    occ_info = prod_cubins.occupancy_facts(occ_target, prod_cubins.physical_gpu(torch.device("cuda")).num_sms)


@contextlib.contextmanager
def occupancy_matched():
    with dev.assume(occ_info), occ_replayer:
        yield


VALIDS = [int(v) for v in args.extra_valid.split(",")] if args.extra_valid else [None]


def with_valid(kw: dict, valid: int | None) -> dict:
    """``kw`` with ``valid`` of its extra list's width live (the rest -1); None: as made (full lengths)."""
    if valid is None:
        return kw
    kw = dict(kw, extra_indices_in_kvcache=kw["extra_indices_in_kvcache"].clone())
    kw["extra_indices_in_kvcache"][..., valid:] = -1
    kw["extra_topk_length"] = torch.full_like(kw["extra_topk_length"], min(valid, int(kw["extra_topk_length"].max())))
    return kw


rows: list[dict] = []
for shape in SHAPES:
    made = [make_inputs(shape, seed=100 * shape.B + i) for i in range(2)]
    for valid in VALIDS:
        sets = [with_valid(kw, valid) for kw in made]
        ref = sparse_decode_reference(**sets[0])[0].float()
        for spec in CONFIGS:
            cfg = config(spec)
            row: dict = dict(B=shape.B, H=shape.H, extra=shape.extra_topk, cfg=spec)
            if valid is not None:
                row["extra_valid"] = valid
            variants = [("t38", lambda: replayer)]
            if occ_replayer is not None:
                variants.append(("t38occ", occupancy_matched))
            if not args.only_t38:
                variants.append(("t36", contextlib.nullcontext))
            for name, ctx in variants:
                try:

                    def call(kw: dict, ctx=ctx, cfg=cfg, spec=spec) -> torch.Tensor:
                        with ctx():
                            return T.sparse_decode_fwd(**kw, config=cfg, num_splits=splits(spec))[0]

                    out = call(sets[0]).float()
                    row[f"err_{name}"] = float((out - ref).norm() / ref.norm())
                    runs = [graphed(lambda kw=kw, call=call: call(kw)) for kw in sets]
                    state = {"i": 0}

                    def step(runs=runs, state=state) -> None:
                        state["i"] += 1
                        runs[state["i"] % 2]()

                    row[f"us_{name}"] = round(do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3, 2)
                except Exception as exc:  # noqa: BLE001 - a config that fails is a row, not the end of the run
                    row[f"error_{name}"] = (str(exc).splitlines() or [repr(exc)])[-1][:200]
            print(json.dumps(row), flush=True)
            rows.append(row)
            meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                        code=args.code, cubins=args.cubins, code_path=replayer.code_path,
                        replayed=replayer.counts, occupancy_of=args.occupancy_of or None,
                        occupancy=occ_replayer.occupancy if occ_replayer else None)  # fmt: skip
            Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
        del sets
    del made
    torch.cuda.empty_cache()
