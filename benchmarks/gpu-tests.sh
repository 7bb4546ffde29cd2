#!/usr/bin/env bash
# On the GPU machine (device tool): the GPU tests in both code paths, native then TRITON_OVERRIDE_ARCH=sm89, each in
# its own pytest run. Cold Triton caches make the serial run compile-bound (~8 s per test on a fresh machine), so the
# tests spread over xdist workers (the compiles run in parallel; one GPU holds them all). Per path: a wall limit
# (PATH_LIMIT_S), a per-test limit that dumps the stack of a hung test, JUnit XML and the slowest tests under $OUT.
# Cold caches: one path takes ~300 s on a fresh machine (397 tests), so there run `native` and `sm89` in two device
# calls (540 s each by default); `both` (275 s per path) fits one call once the caches are warm.
# Usage: bash benchmarks/gpu-tests.sh [native|sm89|both] [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
which=${1:-both}; shift || true
out=${OUT:-/tmp/gpu-tests}; mkdir -p "$out"
bash benchmarks/gpu-setup.sh 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
workers=${WORKERS:-12}
run_path() {
    local path=$1; shift
    local env=(); [ "$path" = sm89 ] && env=(TRITON_OVERRIDE_ARCH=sm89)
    local t0; t0=$(date +%s)
    env "${env[@]}" timeout "${PATH_LIMIT_S:-$default_limit}" python3 -m pytest -m gpu -q -p no:cacheprovider -n "$workers" \
        --timeout=200 --durations=12 --junitxml="$out/gpu-$path.xml" "$@" > "$out/gpu-$path.log" 2>&1
    local rc=$?
    tail -n 25 "$out/gpu-$path.log" | grep -v '^$'
    echo "[gpu-tests] $path rc=$rc $(( $(date +%s) - t0 ))s"
}
default_limit=540; [ "$which" = both ] && default_limit=275
case $which in
    native|sm89) run_path "$which" "$@" ;;
    both) run_path native "$@"; run_path sm89 "$@" ;;
    *) echo "usage: $0 [native|sm89|both] [pytest args]" >&2; exit 2 ;;
esac
# the record for results/gpu-tests/ (the device copy has no git: pass SHA=...)
read -r gpu torch_v triton_v < <(python3 -c 'import torch, triton; print(torch.cuda.get_device_name().replace(" ", "_"), torch.__version__, triton.__version__)')
python3 -m benchmarks.gpu_tests_record "$out" --sha "${SHA:-unknown}" --gpu "${gpu//_/ }" --torch "$torch_v" \
    --triton "$triton_v" --command "bash benchmarks/gpu-tests.sh $which${*:+ $*}" --out "$out/gpu-tests-record.json" && echo "[gpu-tests] wrote $out/gpu-tests-record.json"
