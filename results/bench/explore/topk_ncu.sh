#!/usr/bin/env bash
# Exploratory: Nsight Compute on one wide top-k launch (3.8 cubins, native), B = 64, 16k and 64k rows, k = 512 and
# 2048: where the time goes (speed of light, warp stalls, the hottest SASS lines by stall samples).
#   run(command="SHA=<sha> bash results/bench/explore/topk_ncu.sh", carry=[".gpu-cubins"])   # after build-wide
set -uo pipefail
cd "$(dirname "$0")/../../.."
: "${OUT:?run on the device machine}"
bash benchmarks/gpu-setup.sh >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
NCU=${NCU:-/usr/local/cuda/bin/ncu}
for shape in "16384 2048" "16384 512" "65536 2048"; do
    set -- $shape
    tag="b64-${1}-k${2}"
    timeout 150 "$NCU" --kernel-name _indexer_topk_kernel --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
        --import-source no -o "$OUT/topk-$tag" -f \
        python3 results/bench/explore/topk_one_launch.py --cubins .gpu-cubins/wide --b 64 --ctx "$1" --k "$2" \
        > "$OUT/ncu-$tag.log" 2>&1
    echo "[ncu] $tag rc=$?"; tail -3 "$OUT/ncu-$tag.log" | cut -c1-300
    "$NCU" -i "$OUT/topk-$tag.ncu-rep" --page details > "$OUT/ncu-$tag-details.txt" 2>&1
    "$NCU" -i "$OUT/topk-$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu-$tag-sass.csv" 2>&1
    python3 - "$OUT/ncu-$tag-sass.csv" <<'PY' > "$OUT/ncu-$tag-hot.txt" 2>&1
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
if not rows:
    sys.exit("no rows")
key = next((k for k in rows[0] if "Warp Stall Sampling (All" in k), None)
print("columns:", list(rows[0])[:12], "key:", key)
def val(r):
    try:
        return float(str(r.get(key, "0")).replace(",", ""))
    except ValueError:
        return 0.0
total = sum(val(r) for r in rows) or 1.0
for r in sorted(rows, key=val, reverse=True)[:60]:
    print(f"{100 * val(r) / total:5.1f}%  {r.get('Address', '')}  {r.get('Source', '')[:110]}")
PY
    head -25 "$OUT/ncu-$tag-hot.txt"
    grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Stall" "$OUT/ncu-$tag-details.txt" | head -20
done
