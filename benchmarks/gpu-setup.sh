#!/usr/bin/env bash
# On the GPU machine (device tool): install this package and the wheels carried in .gpu/wheels (sgl-flash-mla) into
# /tmp/site without any index. Then `export PYTHONPATH=/tmp/site` and run from the repository root
# (`python3 -m pytest -m gpu`, `python3 -m benchmarks.decode`): the package lives under src/, so nothing shadows it.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=()
[ -d .gpu/wheels ] && wheels=(.gpu/wheels/*.whl)
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . "${wheels[@]}" 2>&1 \
    | grep -v -e 'is ignored' -e 'BuildBackendWarning' -e '^ *!!' -e '^ *\*\*\*' || true
PYTHONPATH=/tmp/site python3 -c 'import sparsemla.kernels, torch, triton; print("[gpu-setup]", torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)'
