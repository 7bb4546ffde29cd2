#!/usr/bin/env bash
# Exploratory: Nsight Compute's per-source-line view of one wide top-k launch (B = 64, 16k rows, k = 2048; 3.8
# cubins, whose line tables name /work/main/src/...: the repo is linked there so that ncu imports the source).
#   run(command="bash results/bench/explore/topk_ncu_lines.sh", carry=[".gpu-cubins"])   # after build-wide
set -uo pipefail
cd "$(dirname "$0")/../../.."
: "${OUT:?run on the device machine}"
bash benchmarks/gpu-setup.sh >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
NCU=${NCU:-/usr/local/cuda/bin/ncu}
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
timeout 150 "$NCU" --kernel-name _indexer_topk_kernel --launch-count 1 --section SourceCounters \
    --section WarpStateStats --import-source yes -o /tmp/lines -f \
    python3 results/bench/explore/topk_one_launch.py --cubins .gpu-cubins/wide --b 64 --ctx 16384 --k 2048 \
    > /tmp/lines.log 2>&1
echo "[ncu] rc=$?"; tail -2 /tmp/lines.log | cut -c1-300
"$NCU" -i /tmp/lines.ncu-rep --page source --print-source cuda --csv > "$OUT/ncu-lines-cuda.csv" 2>&1
wc -l "$OUT/ncu-lines-cuda.csv"; head -3 "$OUT/ncu-lines-cuda.csv" | cut -c1-400
