"""Exploratory, CPU only (no GPU): what the sm_89 code path's fp8 MMAs become on each GPU.

Under ``TRITON_OVERRIDE_ARCH=sm89`` Triton lowers a kernel for capability 89 (mma.sync, the sm_89 shared-memory
layout) but hands ptxas the GPU's own architecture: ``make_cubin(..., self.target.arch)`` in
``triton/backends/nvidia/compiler.py`` (3.6 and 3.8). So on the H200 the sm_89 path's PTX is assembled for sm_90a.
This script takes each kernel's sm_89 PTX from an ahead-of-time compile (``sparsemla.kernels.aot``, Triton 3.8),
assembles the same PTX with the wheel's ptxas for sm_89, sm_90a and sm_120, and counts the tensor-core and fp8
conversion instructions in the SASS.

- sm_89 and sm_120 run ``mma.sync.m16n8k32 .e4m3`` as one ``QMMA.16832`` (the native fp8 MMA).
- sm_90a (and sm_100a) run it as ``F2FP.F16.E4M3.UNPACK_B`` conversions and two ``HMMA.16816`` f16 MMAs.

So the H200's sm_89-path time of a kernel with fp8 MMAs (the indexer logits) measures that emulation, not the code the
users' GPUs run. The V4 decode's MMAs are bf16 (``HMMA.16816`` on every target), so its sm_89-path time is not
affected.

    .venv/bin/python results/bench/explore/fp8_mma_lowering.py --out results/bench/explore/fp8_mma_lowering-<date>.json
"""

import argparse
import json
import re
import subprocess
import tempfile
from collections import Counter
from datetime import date
from pathlib import Path

import triton

from sparsemla.kernels import aot
from sparsemla.kernels import device as dev

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ASSEMBLE_FOR = ("sm_89", "sm_90a", "sm_120")
KEPT = ("QMMA", "HMMA", "HGMMA", "F2FP")
CASES = {  # name -> (AOT shape label, call): the indexer's fp8 logits, and the V4 decode (bf16 MMAs) for contrast
    "indexer logits B=64 ctx=64k": ("64x65536", lambda: aot._indexer_case(64, 65536, False)),
    "fused logits + top-512 B=1 ctx=4k": ("1x4096", lambda: aot._indexer_case(1, 4096, True)),
    "V4 decode B=1024 H=64 (bf16 MMAs)": ("1024x64", lambda: aot._decode_case(1024, 64, 512)),
}


def sass_ops(ptx: str, arch: str) -> Counter:
    """Opcode counts (with their first modifier) of ``ptx`` assembled by the wheel's ptxas for ``arch``."""
    src = re.sub(r"\.target sm_\w+", f".target {arch}", ptx)
    src = re.sub(r"\.version \d+\.\d+", ".version 8.8", src)  # sm_120 needs PTX ISA >= 8.7
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(src)
        subprocess.run([BIN / "ptxas", f"--gpu-name={arch}", Path(d) / "k.ptx", "-o", Path(d) / "k.cubin"], check=True)
        sass = aot._cubin_tool((Path(d) / "k.cubin").read_bytes(), "-sass")
    opcode = r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+(?:\.[A-Z0-9]+)?)"  # offset, predicate, opcode.modifier
    return Counter(m.group(1) for m in re.finditer(opcode, sass))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    args = p.parse_args()
    version = subprocess.run([BIN / "ptxas", "--version"], capture_output=True, text=True).stdout
    ptxas = re.search(r"release (\S+),", version).group(1)  # "Cuda compilation tools, release 12.9, V12.9.86"
    rows = []
    for case, (shape, make) in CASES.items():
        launches: dict = {}
        with aot.compile_only("sm_89", dev.TARGETS["sm_89"], shape, []), aot.watch_launches(launches.setdefault):
            make()()
        for kernel, compiled in launches.items():
            for arch in ASSEMBLE_FOR:
                ops = sass_ops(compiled.asm["ptx"], arch)
                kept = {o: n for o, n in sorted(ops.items()) if o.split(".")[0] in KEPT}
                total = sum(ops.values())
                rows.append(dict(case=case, kernel=kernel, assembled_for=arch, instructions=total, ops=kept))
                print(f"{case:<36} {kernel:<32} {arch:<7} {total:>6} instructions  {kept}")
    if args.out:
        meta = dict(triton=triton.__version__, ptxas=ptxas, date=date.today().isoformat(), lowered_for="sm_89 (Triton)",
                    what=__doc__.split("\n\n")[0])  # fmt: skip
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
