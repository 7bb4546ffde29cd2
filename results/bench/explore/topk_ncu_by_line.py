"""Exploratory: Nsight Compute's per-instruction counts of one launch (``ncu --page source --print-source sass
--csv``, topk_ncu.sh) summed per source line of topk.py, through the cubin's line table (``nvdisasm -g -gi``: each
instruction's innermost source line and the call chain above it). No GPU needed: the cubin is the one replayed.

    python results/bench/explore/topk_ncu_by_line.py --cubin C.cubin.gz --sass ncu-...-sass.csv --out F.json
"""

import argparse
import collections
import csv
import gzip
import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton

p = argparse.ArgumentParser()
p.add_argument("--cubin", required=True)
p.add_argument("--sass", required=True)
p.add_argument("--out", required=True)
p.add_argument("--note", default="")
args = p.parse_args()
nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(gzip.open(args.cubin).read() if args.cubin.endswith(".gz") else Path(args.cubin).read_bytes())
    f.flush()
    dis = subprocess.run([str(nvdisasm), "-c", "-g", "-gi", f.name], capture_output=True, text=True).stdout
# -gi writes a stack of ``//## File ..., line N [inlined at ...]`` lines before an instruction whose line changed,
# innermost first: an instruction's line is the block's first, with the two frames above it
where: dict[int, str] = {}
line, block = "?", []
for text in dis.splitlines():
    m = re.search(r'//## File "([^"]+)", line (\d+)', text)
    if m:
        block.append(f"{Path(m.group(1)).name}:{m.group(2)}")
        continue
    m = re.search(r"/\*([0-9a-f]{4,5})\*/", text)
    if m:
        if block:
            line, block = " < ".join(block[:3]), []
        where[int(m.group(1), 16)] = line
rows = list(csv.reader(open(args.sass)))[1:]
hdr, data = rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]
base = int(data[0]["Address"], 16)


def val(r: dict, key: str) -> float:
    try:
        return float(r[key].replace(",", ""))
    except (KeyError, ValueError):
        return 0.0


exe, smp = collections.Counter(), collections.Counter()
for r in data:
    src = where.get(int(r["Address"], 16) - base, "?")
    exe[src] += val(r, "Instructions Executed")
    smp[src] += val(r, "Warp Stall Sampling (All Samples)")
te, ts = sum(exe.values()) or 1.0, sum(smp.values()) or 1.0
lines = sorted(exe, key=lambda k: -exe[k])
out = dict(note=args.note, cubin=Path(args.cubin).name, instructions=len(data), mapped=len(where),
           by_line=[dict(line=k, exec_pct=round(100 * exe[k] / te, 2), samples_pct=round(100 * smp[k] / ts, 2))
                    for k in lines if exe[k] / te > 0.003 or smp[k] / ts > 0.003])  # fmt: skip
Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
for r in out["by_line"][:40]:
    print(f"{r['exec_pct']:6.2f}% exec {r['samples_pct']:6.2f}% samples  {r['line']}")
