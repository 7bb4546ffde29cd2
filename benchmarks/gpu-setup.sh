#!/usr/bin/env bash
# On the GPU machine (device tool): install this package and the wheels carried in .gpu/wheels (sgl-flash-mla) into
# /tmp/site without any index. Then: `export PYTHONPATH=/tmp/site` and run Python with -P, so the repo's own
# top-level folders never shadow the installed, mapped `sparsemla` namespace.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheels=()
[ -d .gpu/wheels ] && wheels=(.gpu/wheels/*.whl)
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . "${wheels[@]}" 2>&1 \
    | grep -v -e 'is ignored' -e 'BuildBackendWarning' -e '^ *!!' -e '^ *\*\*\*' || true
PYTHONPATH=/tmp/site python3 -P -c 'import sparsemla.kernels, torch, triton; print("[gpu-setup]", torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)'
