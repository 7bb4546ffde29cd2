#!/usr/bin/env bash
# Here (not on the GPU machine, which reaches no registry): prepare what benchmarks/topk.py needs to build and time
# sglang 0.5.23's own JIT top-k kernels (deepseek_v4/topk_v1.cuh, topk_v2.cuh) on the GPU machine, inside the
# git-ignored .gpu/ folder that a device call carries (`carry: [".gpu"]`):
#
#   .gpu/sglang_src/sglang/   the few files of the sglang 0.5.23 wheel that the JIT build imports: kernels/jit (its
#                             Python build utilities, the include/ tree, csrc/deepseek_v4/topk_v{1,2}.cuh),
#                             kernels/ops/attention/dsv4/{topk,candidate_table,utils}.py, srt/environ.py; plus stub
#                             package __init__ files and a three-function sglang.srt.utils, because the real ones import
#                             sglang's whole runtime (orjson, starlette, PIL, ...), which the GPU machine lacks.
#   .gpu/wheels/              apache-tvm-ffi (the version sglang 0.5.23 pins; abi3, so any CPython >= 3.12), msgspec
#                             (cp312: the GPU machine's python3 is 3.12.3) and sgl-flash-mla (FlashMLA, the decode
#                             benchmarks' baseline), installed there by benchmarks/gpu-setup.sh.
#
# Idempotent: the tree is rebuilt only when its stamp is missing or names another wheel; wheels already there are kept.
# The sglang wheel comes from $SGLANG_WHEEL (a path), else from pip's cache / PyPI (`pip download --no-deps`, 39 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION=0.5.23
TVM_FFI_VERSION=0.1.11  # sglang 0.5.23's Requires-Dist: apache-tvm-ffi==0.1.11
MSGSPEC_VERSION=0.23.0
FLASH_MLA_VERSION=1.0.0  # sgl-flash-mla (abi3): FlashMLA's V4 / V3.2 kernels, the decode benchmarks' baselines
GPU_PY=3.12             # python3 on the GPU machine (/work/.library/device/KINDS.md)
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
dest=.gpu/sglang_src
mkdir -p "$dest" .gpu/wheels

plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
fetch() {  # fetch NAME VERSION GLOB: download one binary wheel for the GPU machine's Python unless it is there
    local name=$1 version=$2 glob=$3
    compgen -G ".gpu/wheels/$glob" >/dev/null && return 0
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PY" --implementation cp \
        "${plat[@]}" -d .gpu/wheels "$name==$version"
}
fetch apache-tvm-ffi "$TVM_FFI_VERSION" "apache_tvm_ffi-$TVM_FFI_VERSION-*.whl"
fetch msgspec "$MSGSPEC_VERSION" "msgspec-$MSGSPEC_VERSION-cp312-*.whl"
fetch sgl-flash-mla "$FLASH_MLA_VERSION" "sgl_flash_mla-$FLASH_MLA_VERSION-*.whl"  # FlashMLA: the decode baselines

wheel=${SGLANG_WHEEL:-}
if [ -z "$wheel" ]; then
    tmp=${TMPDIR:-/tmp}/sparsemla-sglang-wheel
    mkdir -p "$tmp"
    wheel=$(compgen -G "$tmp/sglang-$SGLANG_VERSION-*.whl" | head -n1 || true)
fi
stamp="$dest/sglang/.from-wheel"
if [ -f "$stamp" ] && [ -z "${SGLANG_WHEEL:-}" ] && grep -q "sglang-$SGLANG_VERSION-" "$stamp"; then
    echo "[gpu-sglang-jit] $dest/sglang up to date ($(cat "$stamp"))"
else
    if [ -z "$wheel" ]; then
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PY" --implementation cp \
            "${plat[@]}" -d "$tmp" "sglang==$SGLANG_VERSION"
        wheel=$(compgen -G "$tmp/sglang-$SGLANG_VERSION-*.whl" | head -n1)
    fi
    rm -rf "$dest/sglang"
    "$PY" - "$wheel" "$dest" <<'EOF'
import sys, zipfile
from pathlib import Path

wheel, dest = sys.argv[1], Path(sys.argv[2])
# What the JIT top-k build reads: the build utilities and headers of sglang.kernels.jit, the two top-k sources, the
# cluster-occupancy probe that v2's build runs first (and
# csrc/ must exist: KERNEL_PATH requires include/ and csrc/), the dsv4 wrappers that call load_jit, srt/environ.py.
keep_dirs = ("sglang/kernels/jit/utils/", "sglang/kernels/jit/include/")
keep_files = {
    "sglang/kernels/jit/__init__.py",
    "sglang/kernels/jit/csrc/deepseek_v4/topk_v1.cuh",
    "sglang/kernels/jit/csrc/deepseek_v4/topk_v2.cuh",
    "sglang/kernels/jit/csrc/occupancy/cluster_probe.cuh",  # topk.py probes cluster occupancy before building v2
    "sglang/kernels/ops/attention/dsv4/topk.py",
    "sglang/kernels/ops/attention/dsv4/candidate_table.py",
    "sglang/kernels/ops/attention/dsv4/utils.py",
    "sglang/srt/environ.py",
}
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if (name in keep_files or name.startswith(keep_dirs)) and "__pycache__" not in name:
            z.extract(name, dest)
            n += 1
missing = [f for f in keep_files if not (dest / f).is_file()]
if missing:
    sys.exit(f"[gpu-sglang-jit] {wheel} lacks {missing}")
stub = '"""Stub written by benchmarks/gpu-sglang-jit.sh: the wheel\'s own module imports sglang\'s whole runtime."""\n'
for pkg in ("sglang", "sglang/srt", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention",
            "sglang/kernels/ops/attention/dsv4"):
    (dest / pkg / "__init__.py").write_text(stub)
# sglang.srt.utils(.common): the three functions the JIT utilities and dsv4/topk.py import, with sglang's semantics.
(dest / "sglang/srt/utils").mkdir(parents=True, exist_ok=True)
(dest / "sglang/srt/utils/__init__.py").write_text(stub + "from sglang.srt.utils.common import *  # noqa\n")
(dest / "sglang/srt/utils/common.py").write_text(stub + '''import torch


def is_cuda():
    return torch.cuda.is_available() and torch.version.cuda is not None


def is_xpu():
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def get_cuda_version():
    return tuple(map(int, torch.version.cuda.split("."))) if torch.version.cuda else (0, 0)
''')
(dest / "sglang/utils.py").write_text(stub + "def is_in_ci():\n    return False\n")
(dest / "sglang/.from-wheel").write_text(Path(wheel).name + "\n")
print(f"[gpu-sglang-jit] {n} files of {Path(wheel).name} -> {dest}/sglang")
EOF
fi
du -sh "$dest/sglang" .gpu/wheels/*.whl | sed 's/^/[gpu-sglang-jit] /'
