"""Exploratory, CPU only (no GPU): what one tile iteration of the V4 decode kernel's loop does, per target, from the
installed Triton's own compile (ahead of time, ``sparsemla.kernels.aot``): the MMA layout Triton picked for the two
chained dots, which dot operands are read from shared memory inside the loop, how many shared-memory buffers the
gathered tile is stored into, and the SASS instruction counts of the loop body (shared loads/stores, HMMA / HGMMA,
global loads, barriers, spills). Writes JSON (``--out``) and prints a table.

    .venv/bin/python results/bench/explore/decode_loop_anatomy.py --arch sm_89 --arch sm_90 --out F.json
"""

import argparse
import json
import re
import sys
from collections import Counter
from datetime import date
from pathlib import Path

import triton

from sparsemla.kernels import aot
from sparsemla.kernels import device as dev
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode.triton import choose_config

sys.path.insert(0, str(Path(__file__).parent))
from anatomy_lib import loop_body  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--arch", action="append", default=None)
p.add_argument("--shapes", default="1x64,8x64,64x64,128x64", help="BxH,...")
p.add_argument("--out", default=None)
p.add_argument("--opaque", default="both", choices=["launcher", "both"], help="both: each case with the tile's opaque "
               "move off and on (DecodeConfig.opaque_tile), else the launcher's choice")  # fmt: skip
args = p.parse_args()

OPS = ("LDS", "LDSM", "STS", "HMMA", "HGMMA", "LDG", "LDGSTS", "BAR", "LDL", "STL", "SHFL", "MUFU")


def shared_reads_in_loop(ttgir: str) -> dict:
    """Which values the loop reads from shared memory (``ttg.local_load`` inside ``scf.for``) and allocates."""
    loop = ttgir[ttgir.index("scf.for") :]
    loop = loop[: loop.index("scf.yield")]
    loads = re.findall(r"%(\w+?)(?:_\d+)? = ttg\.local_load %\w+ : !ttg\.memdesc<([0-9x]+)", loop)
    allocs = re.findall(r"%(\w+?)(?:_\d+)? = ttg\.local_alloc %\w+ : \(tensor<([0-9x]+)", loop)
    mma = re.findall(r"#mma\d* = #ttg\.nvidia_mma<\{versionMajor = (\d), versionMinor = \d, warpsPerCTA = \[([\d, ]+)\]", ttgir)
    return {"local_load": loads, "local_alloc": allocs, "mma": [f"v{v} warps [{w}]" for v, w in mma]}


rows = []
for arch in args.arch or ["sm_89", "sm_90"]:
    info = dev.TARGETS[arch]
    for shape, opaque in [(s, o) for s in args.shapes.split(",") for o in ((False, True) if args.opaque == "both"
                                                                         else (None,))]:  # fmt: skip
        b, h = (int(x) for x in shape.split("x"))
        got = {}
        sink: list = []
        default = T.opaque_tile_default
        if opaque is not None:
            T.opaque_tile_default = lambda cfg, info, opaque=opaque: opaque
        try:
            with aot.compile_only(arch, info, shape, sink), aot.watch_launches(lambda n, k, got=got: got.setdefault(n, k)):
                aot._decode_case(b, h, 512)()
        except Exception as exc:  # noqa: BLE001 - e.g. the opaque move forced into a pipelined configuration
            print(f"{arch} B={b} H={h} opaque={opaque}: {type(exc).__name__} (not recorded)")
            continue
        finally:
            T.opaque_tile_default = default
        k = got["_sparse_decode_kernel"]
        ops = Counter(op.split(".")[0] for op in loop_body(aot._cubin_tool(k.asm["cubin"], "-sass")))
        res = next(r for r in sink if r.kernel == "_sparse_decode_kernel")
        cfg = choose_config(info, h, b)
        if opaque is None:
            opaque = default(cfg, info)
        rows.append(dict(arch=arch, B=b, H=h, opaque_tile=opaque, config=f"{cfg.block_h}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
                         f" dv{cfg.dv_split}", shared=res.shared, registers=res.registers, spilled=res.spilled,
                         loop_instructions=sum(ops.values()), loop_ops={o: ops.get(o, 0) for o in OPS},
                         **shared_reads_in_loop(k.asm["ttgir"])))  # fmt: skip
        r = rows[-1]
        print(f"{arch} B={b:<4} H={h:<3} opaque={int(opaque)} {r['config']:<18} smem {r['shared']:>7} reg {r['registers']} spill "
              f"{r['spilled']:>3} | loop {r['loop_instructions']:>5} instr; " + " ".join(f"{o} {n}" for o, n in
              r["loop_ops"].items() if n) + f" | {r['mma']} loads {r['local_load']} allocs {r['local_alloc']}")  # fmt: skip

if args.out:
    meta = dict(triton=triton.__version__, date=date.today().isoformat(), what=__doc__.split("\n\n")[0])
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
