"""The multi-GPU lines of the decode-step section of ``docs/performance.md``: the measured multi-rank results
(``results/bench/ranks<N>-*-step-*.json``, ``python -m benchmarks.step --ranks N``) or, while there is none, that it
has not run and the exact device command that will run it."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench"
DEVICE_COMMAND = (
    "run(kind='nvidia-h200-x8', timeout_s=600, carry=['.gpu'], command='export NCCL_NVLS_ENABLE=0 "
    "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1; bash benchmarks/gpu-setup.sh && "
    "export PYTHONPATH=/tmp/site:$PWD && for d in tp dp-attention; do python3 -m benchmarks.step --ranks 8 "
    "--deployment $d --contexts 4096 --budget-s 240 --out-dir $OUT --trace-dir /tmp/traces || exit; done')"
)


def ranks_lines(results: Path = RESULTS) -> list[str]:
    found = sorted(results.glob("ranks*-step-*.json"))
    out = ["### 8 GPUs (TP 8 and DP-attention + EP 8)", ""]
    if not found:
        return out + [
            "Not run yet: no multi-GPU machine kind (nvidia-h200-x8 / -x2) has been lent to these sessions. The "
            "harness (`benchmarks/step_ranks.py`, NCCL, multicast off in every rank) is tested on the CPU with gloo "
            "(`tests/test_step_ranks.py`); `sparsemla sim --gpus 8 --tp 8` / `--dp-attention` refuses (exit 2) until "
            f"its calibration is measured. Device command: `{DEVICE_COMMAND}`, then "
            "`python -m sparsemla.ops.sim.calibrate_ranks` on each JSON.",
            "",
        ]
    out += [
        "| deployment | ranks | ctx | B per rank | flags off ms | flags on ms | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in found:
        doc = json.loads(path.read_text())
        cell = {(r["variant"], r["ctx"], r["B"]): r["us"] for r in doc["variant_rows"]}
        for ctx, b in sorted({(c, b) for _, c, b in cell}):
            off, on = cell.get(("baseline", ctx, b)), cell.get(("mma_decode+triton_indexer", ctx, b))
            sp = f"{off / on:.1f}x" if off and on else "-"
            fmt = lambda v: "-" if v is None else f"{v / 1e3:,.2f}"  # noqa: E731
            out.append(f"| {doc['deployment']} | {doc['ranks']} | {ctx} | {b} | {fmt(off)} | {fmt(on)} | {sp} |")
        out += ["", f"Source: `results/bench/{path.name}` ({doc['gpu']}, NCCL {doc.get('nccl_version')}).", ""]
    return out
