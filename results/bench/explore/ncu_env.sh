# Sourced by the explore ncu_*.sh scripts (from the repository root, on the device machine): the GPU machine's
# packages, $out (= $OUT/ncu), $ncu (Nsight Compute's CLI), and ncu_pages to export a report's pages.
bash benchmarks/gpu-setup.sh 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}/ncu; mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "[ncu] $ncu $($ncu --version | tail -1)"

ncu_pages() {  # REP FIELDS N: REP.ncu-rep's details page (REP-details.csv) and per-SASS source page
    # (REP-source.csv), then the details metrics whose names match the regex FIELDS, at most N lines
    "$ncu" -i "$1.ncu-rep" --page details --csv > "$1-details.csv" 2>&1
    "$ncu" -i "$1.ncu-rep" --page source --csv --print-source sass > "$1-source.csv" 2>&1
    grep -E "\"($2)\"" "$1-details.csv" | awk -F'","' '{print "  " $(NF-2) " = " $NF " " $(NF-1)}' | tr -d '"' \
        | head -"$3"
}
