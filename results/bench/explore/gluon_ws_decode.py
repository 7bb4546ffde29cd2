"""Exploratory: sm_90's Gluon V4 decode tile warp-specialized against the synchronous one, both the package's.

Session 31 moved this file's kernel into the package (``sparse_decode/gluon_ws_sm90.py``, ``DecodeConfig.
warp_specialize``, on from 4 tiles a program); its first measurement, the explore kernel with a producer of 88, 120 or
136 registers, is results/bench/explore/gluon_ws_decode-native-h100-f271023.json. Here the launcher runs
``sync`` (warp_specialize=False), ``ws`` (True) and ``ws_ids`` (True with ids_ahead: the producer loads the next tile's
slot ids before this tile's gather); the outputs must be bit-equal (``bench`` checks it, a lengths case included).

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_ws_decode.py aot     # here: sm_90 cubin facts
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_ws_decode.py build   # here: .gpu-cubins/gluon_ws
    run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluonws", carry=[".gpu-cubins/gluon_ws", ".gpu"])
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from pathlib import Path

import torch
import triton
import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))

app = typer.Typer(add_completion=False)

VARIANTS = ("sync", "ws", "ws_ids")
SHAPES = "8x64,64x64,128x64,1024x64,8192x64,8x128,64x128,128x128"  # rows x heads


def _inputs(rows: int, heads: int, device: str, fill: bool = True, seed: int = 0) -> dict:
    from benchmarks.decode import Shape, make_inputs

    kw = make_inputs(Shape(rows, heads, 128, 512), seed=seed, device=device, fill=fill)
    keys = ("q", "k_cache", "indices", "extra_k_cache", "extra_indices_in_kvcache", "attn_sink", "softmax_scale")
    return {k: kw[k] for k in keys}


def _launch(variant: str, kw: dict) -> torch.Tensor:
    """out of one call with the launcher's configuration for the shape, warp-specialized or not (VARIANTS)."""
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode import triton as T

    rows, heads = kw["q"].shape[0] * kw["q"].shape[1], kw["q"].shape[2]
    cfg = T.choose_config(dev.launch_info(kw["q"].device), heads, rows)
    cfg = dataclasses.replace(cfg, warp_specialize=variant != "sync", ids_ahead=variant == "ws_ids")
    return T.sparse_decode_fwd(**kw, head_dim_v=512, config=cfg)[0]


@app.command()
def aot(rows: int = 1024, heads: int = 64) -> None:
    """Here (no GPU): compile for sm_90 with this Triton; shared memory, registers, spills, loop op counts."""
    from anatomy_lib import loop_body

    from sparsemla.kernels import aot as A
    from sparsemla.kernels import device as dev

    info = dev.target("sm_90")
    got, sink = {}, []
    with A.compile_only("sm_90", info, "gluon_ws", sink), A.watch_launches(lambda n, k: got.setdefault(n, k),
                                                                           compile_only=True):  # fmt: skip
        kw = _inputs(rows, heads, "cpu", fill=False)
        for variant in VARIANTS:
            got.clear()
            sink.clear()
            _launch(variant, kw)
            name = next(iter(got))
            res = next(r for r in sink if r.kernel == name)
            sass = A._cubin_tool(got[name].asm["cubin"], "-sass")
            body = loop_body(sass)
            ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", op).split()[0] for op in body)
            bars = Counter(m for m in re.findall(r"(BAR\.\w+(?:\.\w+)*\s+[^;]*|SYNCS\.\w+(?:\.\w+)*)", sass))
            print(f"{variant}: {name} shared {res.shared} registers {res.registers} spilled {res.spilled} "
                  f"loop {len(body)}")  # fmt: skip
            print("  " + " ".join(f"{o}:{n}" for o, n in ops.most_common(24)))
            print("  barriers: " + "; ".join(f"{b.strip()} x{n}" for b, n in bars.most_common(12)))


@app.command()
def build(out: Path = Path(".gpu-cubins/gluon_ws"), shapes: str = SHAPES) -> None:
    """Here (no GPU): every variant's launches at SHAPES compiled by this Triton into OUT, for `bench`."""
    from benchmarks import prod_cubins

    def workload() -> None:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            kw = _inputs(rows, heads, "cpu", fill=False)
            for variant in VARIANTS:
                _launch(variant, kw)
            if rows <= 1024:  # bench's lengths case: valid-length pointers specialise the launch
                kw["topk_length"] = torch.zeros(rows, dtype=torch.int32)
                kw["extra_topk_length"] = torch.zeros(rows, dtype=torch.int32)
                for variant in VARIANTS:
                    _launch(variant, kw)

    added = prod_cubins.build(workload, out, "native")
    print(f"Triton {triton.__version__}: {len(added)} cubins added to {out}")


@app.command()
def bench(cubins: Path = Path(".gpu-cubins/gluon_ws"), shapes: str = SHAPES,
          out: Path = Path("gluon_ws_decode.json"), git_sha: str = "unknown") -> None:  # fmt: skip
    """GPU: every variant from CUBINS (Triton 3.8) replayed; bit-equality with the synchronous tile and the error
    against the fp32 reference (<= 1024 rows); CUDA-graph median (2 input sets rotated); JSON to OUT."""
    import json

    from triton.testing import do_bench

    from benchmarks import prod_cubins
    from benchmarks.decode import graphed
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

    rows_out: list[dict] = []
    with prod_cubins.Replayer(cubins) as counts:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            sets = [_inputs(rows, heads, "cuda", seed=100 * rows + i) for i in range(2)]
            want = sparse_decode_reference(**sets[0], head_dim_v=512)[0].float() if rows <= 1024 else None
            base = None
            for variant in VARIANTS:
                row = dict(rows=rows, H=heads, variant=variant)
                try:
                    got = _launch(variant, sets[0])
                    base = got if base is None else base
                    ref = base.float() if want is None else want
                    runs = [graphed(lambda kw=kw, v=variant: _launch(v, kw)) for kw in sets]
                    st = {"i": 0}

                    def step(runs=runs, st=st) -> None:
                        st["i"] += 1
                        runs[st["i"] % 2]()

                    us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
                    row.update(us=round(us, 2), err=float((got.float() - ref).norm() / ref.norm()),
                               equal_to_sync=bool(torch.equal(got, base)))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - a failing variant is a finding
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            if rows <= 1024:  # valid lengths (some 0), -1 entries: every variant bit-equal to the package's tile
                kw = dict(sets[0])
                gen = torch.Generator(device="cuda").manual_seed(rows)
                kw["topk_length"] = torch.randint(0, 129, (rows,), device="cuda", dtype=torch.int32, generator=gen)
                kw["extra_topk_length"] = torch.randint(0, 513, (rows,), device="cuda", dtype=torch.int32,
                                                        generator=gen)  # fmt: skip
                kw["topk_length"][::5] = 0
                kw["indices"] = kw["indices"].clone()
                kw["indices"][:, :, 100:] = -1
                try:
                    ref = _launch("sync", kw)
                except Exception as exc:  # noqa: BLE001
                    print(json.dumps(dict(rows=rows, H=heads, case="lengths", error=str(exc)[-300:])), flush=True)
                    continue
                for variant in VARIANTS[1:]:
                    row = dict(rows=rows, H=heads, variant=variant, case="lengths")
                    try:
                        row["equal_to_sync"] = bool(torch.equal(_launch(variant, kw), ref))
                    except Exception as exc:  # noqa: BLE001
                        row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                    rows_out.append(row)
                    print(json.dumps(row), flush=True)
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, git_sha=git_sha,
               cubins=str(cubins), replayed=counts, rows=rows_out)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    app()
