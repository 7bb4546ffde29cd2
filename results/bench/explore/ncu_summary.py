"""Summarise Nsight Compute CSV exports of ``ncu_decode.sh`` (details page + per-SASS source page) into one JSON:
duration, occupancy and issue figures, warp-stall samples by reason and by opcode, executed warp instructions by
opcode, and shared-memory wavefronts against ideal (bank conflicts) per opcode.

    python results/bench/explore/ncu_summary.py PREFIX... --out F.json   (PREFIX = path without -details.csv)
"""

import argparse
import csv
import json
import re
from collections import Counter

p = argparse.ArgumentParser()
p.add_argument("prefixes", nargs="+")
p.add_argument("--out", required=True)
args = p.parse_args()

DETAILS = ("Duration", "Achieved Occupancy", "Issue Slots Busy", "No Eligible", "Eligible Warps Per Scheduler",
           "Warp Cycles Per Issued Instruction", "Executed Instructions", "Registers Per Thread", "L2 Hit Rate",
           "DRAM Throughput", "Local Memory Spilling Requests", "Dynamic Shared Memory Per Block")  # fmt: skip


def opcode(src: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", src.strip())
    return text.split(" ")[0] if text else "?"


out = {}
for prefix in args.prefixes:
    details = {}
    for r in csv.DictReader(open(f"{prefix}-details.csv")):
        if r["Metric Name"] in DETAILS:
            details[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
    lines = open(f"{prefix}-source.csv").read().splitlines()
    rows = list(csv.DictReader(lines[1:]))  # first line: kernel name
    stalls, by_op, executed, wave, ideal = Counter(), Counter(), Counter(), Counter(), Counter()
    for r in rows:
        op = opcode(r["Source"])
        base = op.split(".")[0]
        samples = int(r["Warp Stall Sampling (All Samples)"] or 0)
        by_op[base] += samples
        executed[op] += int(r["Instructions Executed"] or 0)
        for key, value in r.items():
            if key.startswith("stall_") and "(Not" not in key and value not in ("", "-"):
                stalls[key.removeprefix("stall_")] += int(value)
        if r.get("L1 Wavefronts Shared") not in (None, "", "-"):
            wave[base] += int(r["L1 Wavefronts Shared"])
            ideal[base] += int(r["L1 Wavefronts Shared Ideal"] or 0)
    total = sum(by_op.values()) or 1
    out[prefix.rsplit("/", 1)[-1]] = {
        "details": details,
        "stall_pct": {k: round(100 * v / total, 1) for k, v in stalls.most_common(10)},
        "samples_pct_by_opcode": {k: round(100 * v / total, 1) for k, v in by_op.most_common(12)},
        "executed_warp_instructions_by_opcode": dict(executed.most_common(15)),
        "shared_wavefronts_vs_ideal": {k: [wave[k], ideal[k]] for k in wave if wave[k]},
    }
json.dump(out, open(args.out, "w"), indent=1)
print(json.dumps({k: (v["details"].get("Duration"), v["stall_pct"]) for k, v in out.items()}, indent=1))
