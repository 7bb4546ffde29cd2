#!/usr/bin/env bash
# `make setup`: create the virtualenv and install everything `make test` / `make demo` need on a fresh Debian machine.
#   1. .venv with Python >= 3.11 (sglang 0.5.23 needs it)
#   2. torch 2.14.1 (sglang's pin; CPU machines take it from local disk) — requirements/torch-cpu.txt
#   3. this package, editable, with the test/loadtest/ops extras
#   4. the sglang 0.5.23 contract tier: sglang --no-deps + the small packages its plugin loader, sm120 decode module and
#      dsv4 indexer import (requirements/sglang-contract.txt) — the tests run sglang's REAL code on the CPU
#   5. system tools when apt is usable and they are missing: Debian's prometheus (prometheus + promtool) and
#      docker-compose (schema validation of compose.yaml, no daemon needed)
# Idempotent: re-running only installs what is missing.
set -euo pipefail

PYTHON="${1:-python3}"
VENV="${2:-.venv}"

say() { printf '\033[36m[setup]\033[0m %s\n' "$*"; }

if ! "$PYTHON" -c 'import sys; raise SystemExit(sys.version_info < (3, 11))'; then
    echo "error: $PYTHON is $("$PYTHON" --version 2>&1); sglang 0.5.23 needs Python >= 3.11 (make setup PYTHON=python3.11)" >&2
    exit 2
fi

# A fresh .venv takes about 7 GB (torch 2.14.1 is the CUDA build, ~5.5 GB). A disk that fills half-way makes pip report
# broken downloads and a missing sglang, far from the cause: check first and say what to free.
need_mb=1024
"$VENV/bin/python" -c 'import torch' 2>/dev/null || need_mb=8192
mkdir -p "$VENV"
free_mb=$(( $(df -Pk "$VENV" | awk 'NR == 2 {print $4}') / 1024 ))
if [ "$free_mb" -lt "$need_mb" ]; then
    echo "error: $free_mb MB free on the disk holding $VENV; make setup needs about $need_mb MB there." >&2
    echo "       Free space (old clones, caches: du -sh /tmp/*) and run make setup again." >&2
    exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q --retries 10 --timeout 60)
QUIET=(-e 'is ignored' -e 'requires' -e 'incompatible')

# pip_install ARGS...: `pip install ARGS`, three tries ten and twenty seconds apart (a dropped connection on a 40 MB
# wheel is common); prints pip's output without its noise lines; fails with pip's last output when all three fail.
pip_install() {
    local log try
    log=$(mktemp)
    for try in 1 2 3; do
        if "${PIP[@]}" install "$@" >"$log" 2>&1; then
            grep -v "${QUIET[@]}" "$log" || true
            rm -f "$log"
            return 0
        fi
        grep -v "${QUIET[@]}" "$log" | tail -n 15 >&2 || true
        [ "$try" -lt 3 ] && { say "pip install $* failed (try $try of 3); retrying"; sleep $(( try * 10 )); }
    done
    rm -f "$log"
    echo "error: pip install $* failed three times (network or disk; pip's output is above)" >&2
    return 1
}

pip_install --upgrade "pip>=25.1" "setuptools>=77" wheel
# pip >= 25.1 resumes a broken download where it stopped instead of starting over.
PIP+=(--resume-retries 10)

if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.14.1")' 2>/dev/null; then
    say "installing torch (requirements/torch-cpu.txt)"
    pip_install -r requirements/torch-cpu.txt
fi

say "installing sparsemla (editable) with extras test, loadtest, ops"
pip_install -e ".[test,loadtest,ops]"

if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("sglang") != "0.5.23")' 2>/dev/null; then
    say "installing the sglang 0.5.23 contract tier"
    pip_install --no-deps "sglang==0.5.23"
fi
pip_install -r requirements/sglang-contract.txt

# Fail here, loudly, if the contract tier cannot import: the tests would otherwise skip what matters most.
"$VENV/bin/python" - <<'EOF'
import importlib, sys
for mod in ("sglang.srt.plugins", "sglang.srt.plugins.hook_registry"):
    importlib.import_module(mod)
import torch, triton
print(f"[setup] torch {torch.__version__}, triton {triton.__version__}, sglang plugin loader importable")
EOF

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "apt-get install ${need_apt[*]}"
        # Debian starts a system prometheus on :9090 after install; policy-rc.d keeps it from starting so `make up`
        # and the tests own that port.
        made_policy=0
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
        [ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    else
        say "cannot install ${need_apt[*]} (not root or no apt): the tests that need them will say so and skip"
    fi
fi
say "done"
