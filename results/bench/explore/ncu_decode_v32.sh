#!/usr/bin/env bash
# Exploratory, one device call: Nsight Compute on the V3.2 decode at B = 64, H = 128 (issue #17), native path: the
# package's chosen tile from Triton 3.8 cubins (build: gpu_t38.sh build-decode) and FlashMLA's kernel at the same
# shape. Writes under $OUT/ncu per run the details page (CSV), the source page per SASS instruction (CSV, stall
# samples per instruction) and a summary (ncu_summary.py).
#   run(command="bash results/bench/explore/ncu_decode_v32.sh", carry=[".gpu-cubins/decode_v32", ".gpu"])
set -uo pipefail
cd "$(dirname "$0")/../../.."
source results/bench/explore/ncu_env.sh
B=${B:-64} H=${H:-128}
for who in ours flashmla; do
    if [ "$who" = ours ]; then k=regex:_sparse_decode_v32; a=(--cubins .gpu-cubins/decode_v32); else k=regex:flash; a=(--flashmla); fi
    rep="$out/decode_v32-B$B-H$H-$who"
    t0=$(date +%s)
    timeout 200 "$ncu" --clock-control none --target-processes all -k "$k" --launch-skip 2 --launch-count 1 \
        --set full --import-source yes -f -o "$rep" \
        python3 results/bench/explore/ncu_decode_v32.py --B "$B" --H "$H" "${a[@]}" 2>&1 | grep -v '^==PROF==' | tail -4
    ncu_pages "$rep" 'Duration|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued Instruction|Executed Ipc Active|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Executed Instructions' 14
    echo "[ncu] $who $(( $(date +%s) - t0 ))s; $(wc -l < "$rep-source.csv") source rows"
done
python3 results/bench/explore/ncu_summary.py "$out"/decode_v32-B$B-H$H-ours "$out"/decode_v32-B$B-H$H-flashmla \
    --out "$out/ncu_decode_v32-summary.json" && python3 - "$out/ncu_decode_v32-summary.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for name, s in d.items():
    print(name.rsplit("/", 1)[-1])
    for k, v in s.items():
        if isinstance(v, dict):
            top = sorted(v.items(), key=lambda kv: -kv[1] if isinstance(kv[1], (int, float)) else 0)[:8]
            print(f"  {k}: " + ", ".join(f"{a}={b}" for a, b in top))
        else:
            print(f"  {k}: {v}")
PY
rm -f "$out"/*.ncu-rep
