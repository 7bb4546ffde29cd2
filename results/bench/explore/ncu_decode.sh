#!/usr/bin/env bash
# Exploratory, one device call: Nsight Compute on the V4 decode kernel at B = 64, H = 64 (issue #13's sm_89-path
# target), sm_89 code path then native, Triton 3.6. Writes under $OUT/ncu: per path the details page (CSV) and the
# source page per SASS instruction (CSV, stall samples per instruction), and the .ncu-rep.
#   run(command="bash results/bench/explore/ncu_decode.sh", carry=[".gpu"])
set -uo pipefail
cd "$(dirname "$0")/../../.."
source results/bench/explore/ncu_env.sh
for path in ${PATHS:-sm89 native}; do
    env=(); [ "$path" = sm89 ] && env=(TRITON_OVERRIDE_ARCH=sm89)
    rep="$out/decode-B${B:-64}-H${H:-64}-$path"
    t0=$(date +%s)
    env "${env[@]}" timeout 200 "$ncu" --clock-control none --target-processes all -k regex:_sparse_decode_kernel \
        --launch-skip 2 --launch-count 1 --set full --import-source yes -f -o "$rep" \
        python3 results/bench/explore/ncu_decode.py --B "${B:-64}" --H "${H:-64}" 2>&1 | grep -v '^==PROF==' | tail -4
    ncu_pages "$rep" 'Duration|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Warp Cycles Per Issued Instruction|Shared Memory Configuration Size|L1/TEX Hit Rate|Memory Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Block Limit Shared Mem|Block Limit Registers' 20
    echo "[ncu] $path $(( $(date +%s) - t0 ))s; $(wc -l < "$rep-source.csv") source rows"
done
