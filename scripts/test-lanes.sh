#!/usr/bin/env bash
# `make test`'s pytest run (everything but the GPU and container tests) in two lanes where the machine has two or
# more cores. As one process the suite keeps one core busy for ~23 minutes (two cores, clean clone), while the
# ahead-of-time compile behind tests/test_aot.py (tests/aot_background.py: two children, ~1,000 CPU-seconds with a cold
# Triton cache) fills the other core for the first ~17 and then leaves it idle.
#
#   lane 1, at `nice` 10 beside the compile: tests/test_aot.py (its children start with this lane) and the two test
#           files that spend ~220 s importing sglang in fresh processes (the real load_plugins(), once per case), which
#           time nothing, so the two cores end at about the same time;
#   lane 2: everything else at normal priority, printed as it runs: the end-to-end tests whose points, scrapes and
#           deadlines are timed (simulator, Locust, Prometheus, the demo) keep the CPU they had beside the niced
#           compile before.
#
# Lane 1 prints when both have ended. The exit status is lane 2's if it failed, else lane 1's (pytest's 5, "no tests
# collected", stays 5 for .ci/run). With one core, or SPARSEMLA_TEST_ONE_LANE=1, one pytest process runs everything.
# Usage: bash scripts/test-lanes.sh PYTHON [pytest args for both lanes]
set -uo pipefail
cd "$(dirname "$0")/.."
py=${1:?usage: $0 PYTHON [pytest args]}; shift
mark="not gpu and not containers"

# Every other test file runs in lane 2.
lane1=(tests/test_aot.py tests/test_reliability_plugin.py tests/test_dsa_v32_contract.py)

if [ "$(nproc)" -lt 2 ] || [ "${SPARSEMLA_TEST_ONE_LANE:-0}" = 1 ]; then
    exec "$py" -m pytest -m "$mark" "$@"
fi
for f in "${lane1[@]}"; do
    [ -f "$f" ] || { echo "scripts/test-lanes.sh: $f is listed in lane 1 but does not exist: fix the list" >&2; exit 2; }
done

work=$(mktemp -d /tmp/sparsemla-lanes-XXXXXX)
ignores=()
for f in "${lane1[@]}"; do ignores+=(--ignore="$f"); done
# its own temporary base and no cache plugin: the two pytest processes share nothing on disk
nice -n 10 "$py" -m pytest -m "$mark" -p no:cacheprovider --basetemp="$work/tmp" "${lane1[@]}" "$@" \
    > "$work/lane1.log" 2>&1 &
lane1_pid=$!
trap 'kill "$lane1_pid" 2>/dev/null; wait "$lane1_pid" 2>/dev/null; rm -rf "$work"; exit 130' INT TERM

echo "[test-lanes] lane 1 (${#lane1[@]} files, nice 10) runs beside this one; its output follows this lane's"
"$py" -m pytest -m "$mark" "${ignores[@]}" "$@"
lane2=$?
wait "$lane1_pid"
lane1_status=$?
echo
echo "[test-lanes] ======== lane 1: the ahead-of-time compile and the fresh-process sglang loads ========"
cat "$work/lane1.log"
rm -rf "$work"
echo "[test-lanes] lane 1 exited $lane1_status, lane 2 exited $lane2"
[ "$lane2" -ne 0 ] && exit "$lane2"
exit "$lane1_status"
