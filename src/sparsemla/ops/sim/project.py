"""PROJECTED calibrations: the measured H200 decode step scaled to a GPU nobody here has run on.

``sparsemla calibrate --project rtx-pro-6000`` (or ``l40s``, ``a100``, ``all``) writes ``calibration/<gpu>.json`` from
the measured H200 files; ``--check`` fails when a committed file is not what they give now. Every number comes from:

* ``calibration/default.json``: the decode-step benchmark on the H200 (per state, per (batch, context) point: the step
  time and the GPU time of every kernel group), and the step JSON it was calibrated from (``results/bench/step-*``:
  the model's compress ratios, i.e. how many rows each layer's decode reads);
* the newest ``results/bench/decode-*.json``: our decode in both code paths (CUDA-graph replay, H = 64, 128 + 512
  indices), native wgmma and ``TRITON_OVERRIDE_ARCH=sm89`` (the mma.sync code that sm_80..sm_120 get);
* the newest ``results/bench/indexer_paths-*.json``: our indexer logits in both code paths.

The method (:func:`project_kernel`), per kernel group of the H200 step, with ``bw`` = H200 bandwidth / the GPU's and
``sm`` = H200 SMs / the GPU's (both from the spec sheets, :mod:`sparsemla.ops.sim.gpus`):

* our decode and combine kernels: H200 time x the measured sm_89-path / wgmma ratio at that batch x max(1, sm), and
  for the decode kernel at least the KV rows it reads (584 bytes each) over the GPU's bandwidth;
* our indexer logits: H200 time x the measured sm_89-path / wgmma ratio at that batch and compressed length x
  max(1, sm), at least the keys read (132 bytes per compressed token, ratio-4 layers) over the GPU's bandwidth;
  our top-k: x max(1, sm) (no tensor-core op: the code path does not change it);
* sglang's per-head Triton decode (the baseline's attention): x sm (thousands of small programs, bound by per-SM
  work on L2-resident rows: more SMs help it, fewer slow it), at least the same KV bytes over the bandwidth;
* torch's top-k kernels (category ``indexer``): x max(1, sm) (latency-bound);
* every other kernel (GEMMs streaming weights at decode batch sizes, elementwise, copies, the torch indexer's gathers):
  x bw (memory-bound);
* the rest of the step (launch gaps, host time under CUDA graphs): unchanged.

More SMs are never assumed to speed up our kernels (max(1, sm)) and the baseline's decode gets the benefit of every
extra SM: the projected speed-ups lean low. Not modelled: clocks, L2 sizes, tensor-core rate per SM, the sm_80 code
(its bf16 variant was never measured; the sm_89 path stands in), cuBLAS choosing other kernels (the kernel names stay
the H200's), memory capacity (whether the model and KV pool fit) and the all-to-all (not in the measured step either;
over PCIe it would cost more). Prefill (not measured on the H200 either): its weight-stream term x bw, its per-token
compute x max(1, sm) -- optimistic, tensor-core rates differ by more than SM counts.

The H200's reference states (sglang's fast path there: FlashMLA's decode, measured beside the flag states) are not
projected: FlashMLA has no build for these GPUs and sglang's fast path on them was never measured. Each projected file
names them with ``measured: false`` and the reason (:data:`sparsemla.ops.sim.gpus.FAST_PATH_NOT_MEASURED`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sparsemla.ops.sim import gpus
from sparsemla.ops.sim.calibrate_from_step import sha256_of
from sparsemla.ops.sim.calibration import (
    DEFAULT_PATH,
    GPU_FILES,
    Calibration,
    PrefillModel,
    Provenance,
    ReferenceState,
    Source,
    StateCalibration,
    load_calibration,
    write_calibration,
)

RESULTS_DIR = Path("results/bench")
PROJECTABLE = tuple(k for k in GPU_FILES if k != "h200")
KV_BYTES_PER_ROW = 584  # DeepSeek-V4 page-split fp8 KV row: 448 fp8 nope + 64 bf16 rope (128 B) + 8 scale bytes
INDEX_BYTES_PER_TOKEN = 132  # indexer key: 128 fp8 + one fp32 scale
SWA_ROWS, EXTRA_TOPK = 128, 512  # rows every decode call reads: the SWA window + at most 512 compressed entries
INDEXER_RATIO = 4  # the indexer runs on the ratio-4 (CSA) layers, over ctx / 4 compressed tokens
DECODE_SHAPE = {"H": 64, "swa_topk": SWA_ROWS, "extra_topk": EXTRA_TOPK}
OUR_DECODE, OUR_COMBINE = "_sparse_decode_kernel", "_sparse_decode_combine_kernel"
# the Gluon tiles an H200 runs from 8 programs, warp-specialized from 4 tiles a program (its traces name them)
OUR_DECODE_SM90 = ("_sparse_decode_sm90_kernel", "_sparse_decode_sm90_ws_kernel")
OUR_LOGITS, OUR_TOPK = "_indexer_logits_kernel", "_indexer_topk_kernel"
SGLANG_DECODE = "_tiled_sparse_decode_kernel"


class ProjectionError(ValueError):
    """An input file is missing or lacks what the projection needs; the message names it."""


@dataclass(frozen=True)
class Factors:
    """H200 / GPU ratios: ``bandwidth`` > 1 means the GPU streams bytes that much slower, ``sms`` > 1 fewer SMs."""

    bandwidth: float
    sms: float
    bandwidth_bytes_s: float

    @classmethod
    def of(cls, gpu: str) -> Factors:
        ref, target = gpus.GPUS["h200"], gpus.GPUS[gpu]
        return cls(ref.bandwidth_tb_s / target.bandwidth_tb_s, ref.sms / target.sms, target.bandwidth_tb_s * 1e12)


def _linear(points: Mapping[float, float], x: float) -> float:
    """Piecewise-linear through ``points``, clamped to the end values outside them."""
    xs = sorted(points)
    if x <= xs[0]:
        return points[xs[0]]
    if x >= xs[-1]:
        return points[xs[-1]]
    i = max(k for k in range(len(xs) - 1) if xs[k] <= x)
    x0, x1 = xs[i], xs[i + 1]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class CodePaths:
    """Measured sm_89-path / wgmma ratios: decode by batch; indexer logits by batch and compressed length."""

    decode: dict[int, float]
    logits: dict[int, dict[int, float]]

    def decode_ratio(self, batch: float) -> float:
        return _linear(self.decode, batch)

    def logits_ratio(self, batch: float, compressed: float) -> float:
        return _linear({b: _linear(row, compressed) for b, row in self.logits.items()}, batch)

    @classmethod
    def from_docs(cls, decode_doc: Mapping[str, Any], indexer_doc: Mapping[str, Any]) -> CodePaths:
        graph = {}
        for r in decode_doc.get("rows", []):
            if all(r.get(k) == v for k, v in DECODE_SHAPE.items()):
                graph[(r["provider"], r["B"])] = float(r["us"])
        decode = {b: graph[("sparsemla_sm89path_graph", b)] / us for (p, b), us in graph.items()
                  if p == "sparsemla_graph" and ("sparsemla_sm89path_graph", b) in graph}  # fmt: skip
        cells = {(r["provider"], r["B"], r["ctx"]): float(r["us"]) for r in indexer_doc.get("rows", [])}
        logits: dict[int, dict[int, float]] = {}
        for (p, b, ctx), us in cells.items():
            sm89 = cells.get(("sparsemla_sm89path_graph", b, ctx))
            if p == "sparsemla_graph" and sm89 is not None:
                logits.setdefault(b, {})[ctx] = sm89 / us
        if not decode or not logits:
            raise ProjectionError("the decode / indexer_paths results hold no graph replay in both code paths")
        return cls(dict(sorted(decode.items())), {b: dict(sorted(r.items())) for b, r in sorted(logits.items())})


@dataclass(frozen=True)
class StepShape:
    """What the H200 step read per layer: its compress ratios (0: SWA only, 4: indexer layers, 128)."""

    compress_ratios: tuple[int, ...]

    def decode_bytes(self, batch: float, context: float) -> float:
        """KV bytes the decode calls of one step read: per layer the SWA rows plus its valid compressed entries."""
        rows = sum(SWA_ROWS + (min(EXTRA_TOPK, context // r) if r else 0) for r in self.compress_ratios)
        return batch * rows * KV_BYTES_PER_ROW

    def logits_bytes(self, batch: float, context: float) -> float:
        """Index-key bytes the indexer logits of one step read (each key once, ratio-4 layers)."""
        layers = sum(1 for r in self.compress_ratios if r == INDEXER_RATIO)
        return layers * batch * (context / INDEXER_RATIO) * INDEX_BYTES_PER_TOKEN


def project_kernel(
    name: str, category: str, us: float, batch: int, context: int, f: Factors, paths: CodePaths, shape: StepShape
) -> float:
    """The projected GPU time (µs, one step) of a kernel group that took ``us`` on the H200 (module docstring)."""
    floor_us = 0.0
    if name in (OUR_DECODE, *OUR_DECODE_SM90, OUR_COMBINE):
        scaled = us * paths.decode_ratio(batch) * max(1.0, f.sms)
        floor_us = shape.decode_bytes(batch, context) / f.bandwidth_bytes_s * 1e6 if name != OUR_COMBINE else 0.0
    elif name == OUR_LOGITS:
        scaled = us * paths.logits_ratio(batch, context / INDEXER_RATIO) * max(1.0, f.sms)
        floor_us = shape.logits_bytes(batch, context) / f.bandwidth_bytes_s * 1e6
    elif name == OUR_TOPK or category == "indexer":
        scaled = us * max(1.0, f.sms)
    elif name == SGLANG_DECODE:
        scaled = us * f.sms
        floor_us = shape.decode_bytes(batch, context) / f.bandwidth_bytes_s * 1e6
    else:
        scaled = us * f.bandwidth
    return max(scaled, floor_us) if us > 0 else 0.0


def project_state(
    state: StateCalibration, f: Factors, paths: CodePaths, shape: StepShape, gpu: str
) -> StateCalibration:
    """One state on ``gpu``: every kernel projected, the step = their sum + the H200's gap (launches, host)."""

    def cell(i: int, j: int) -> tuple[float, dict[str, float]]:
        b, c = state.batch[i], state.context[j]
        h200 = {k.name: state.kernel_us[k.name][i][j] for k in state.kernels}
        gap = max(state.step_us[i][j] - sum(h200.values()), 0.0)
        times = {k.name: project_kernel(k.name, k.category, h200[k.name], b, c, f, paths, shape) for k in state.kernels}
        return sum(times.values()) + gap, times

    grid = [[cell(i, j) for j in range(len(state.context))] for i in range(len(state.batch))]
    return replace(
        state,
        step_us=tuple(tuple(step for step, _ in row) for row in grid),
        kernel_us={k.name: tuple(tuple(times[k.name] for _, times in row) for row in grid) for k in state.kernels},
        description=gpus.state_descriptions(gpu)[state.variant],
    )


@dataclass(frozen=True)
class Inputs:
    """The measured files a projection reads (see the module docstring)."""

    measured: Path
    step: Path
    decode: Path
    indexer: Path

    @classmethod
    def default(cls, results_dir: Path = RESULTS_DIR, measured: Path = DEFAULT_PATH) -> Inputs:
        """default.json, the step JSON it names, and the newest decode / indexer_paths results in ``results_dir``."""
        cal = load_calibration(measured)
        if cal.kind != "measured" or not cal.provenance.sources:
            raise ProjectionError(f"{measured} is {cal.kind}, not a measured calibration naming its step result")

        def newest(pattern: str) -> Path:
            found = sorted(results_dir.glob(pattern))
            if not found:
                raise ProjectionError(f"no {pattern} in {results_dir} (run from the repository root)")
            return found[-1]

        step = results_dir / cal.provenance.sources[0].path
        return cls(measured, step, newest("decode-*.json"), newest("indexer_paths-*.json"))


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ProjectionError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ProjectionError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise ProjectionError(f"{path}: expected a JSON object")
    return doc


def _sources(inputs: Inputs, measured: Calibration, docs: Sequence[Mapping[str, Any]]) -> tuple[Source, ...]:
    step_doc, decode_doc, indexer_doc = docs
    return (
        Source(f"src/sparsemla/ops/sim/calibration/{inputs.measured.name}", measured.provenance.git_sha,
               sha256_of(inputs.measured), "measured H200 decode-step calibration (per-kernel times)"),
        Source(f"results/bench/{inputs.step.name}", str(step_doc.get("git_sha", "")), sha256_of(inputs.step),
               "decode-step benchmark it was calibrated from (compress ratios)"),
        Source(f"results/bench/{inputs.decode.name}", str(decode_doc.get("git_sha", "")), sha256_of(inputs.decode),
               "decode benchmark, wgmma and sm_89 code paths (graph replay)"),
        Source(f"results/bench/{inputs.indexer.name}", str(indexer_doc.get("git_sha", "")),
               sha256_of(inputs.indexer), "indexer benchmark, wgmma and sm_89 code paths (graph replay)"),
    )  # fmt: skip


def _method(gpu: str, f: Factors, paths: CodePaths) -> str:
    target, ref = gpus.GPUS[gpu], gpus.GPUS["h200"]
    decode = ", ".join(f"B={b}: {r:.2f}" for b, r in paths.decode.items())
    logits = "; ".join(
        f"B={b}: " + ", ".join(f"{c}: {r:.2f}" for c, r in row.items()) for b, row in paths.logits.items()
    )
    return (
        f"Projected from the H200 measurements by sparsemla.ops.sim.project (`sparsemla calibrate --project {gpu}`). "
        f"bw = {ref.bandwidth_tb_s:g} / {target.bandwidth_tb_s:g} TB/s = {f.bandwidth:.3f}; sm = {ref.sms} / "
        f"{target.sms} SMs = {f.sms:.3f}. Per kernel group of the measured step: our decode + combine x the measured "
        f"sm_89-path / wgmma ratio by batch ({decode}) x max(1, sm), the decode at least its KV rows "
        f"({KV_BYTES_PER_ROW} B each) / bandwidth; our indexer logits x the measured ratio by batch and compressed "
        f"length ({logits}) x max(1, sm), at least its keys ({INDEX_BYTES_PER_TOKEN} B per compressed token) / "
        "bandwidth; our top-k and torch's top-k kernels x max(1, sm); sglang's per-head Triton decode x sm, at least "
        "the same KV bytes / bandwidth; every other kernel x bw; the step's remaining gap (launches, host) unchanged. "
        "Prefill: fixed (weight stream) x bw, per token x max(1, sm)."
    )


NOT_MODELLED = (
    "Not modelled: clocks, L2 sizes, tensor-core rate per SM, cuBLAS choosing other kernels on this GPU (kernel names "
    "are the H200's), memory capacity (whether the weights and KV pool fit), the all-to-all of the EP8 deployment "
    "(not in the measured step either; over PCIe it costs more than over NVLink). Prefill is derived on the H200 too "
    "and optimistic here (tensor-core rates differ by more than SM counts), so TTFT is the weakest number."
)


def project_calibration(gpu: str, inputs: Inputs | None = None) -> Calibration:
    """The projected calibration of ``gpu`` (one of :data:`PROJECTABLE`) from ``inputs`` (default: the repo's)."""
    if gpu not in PROJECTABLE:
        raise ProjectionError(
            f"cannot project {gpu!r}: projectable GPUs are {', '.join(PROJECTABLE)} (h200 is measured)"
        )
    inputs = inputs or Inputs.default()
    measured = load_calibration(inputs.measured)
    if measured.kind != "measured" or measured.gpu is None or measured.gpu.key != "h200":
        raise ProjectionError(f"{inputs.measured} is not the measured H200 calibration")
    docs = [_read(p) for p in (inputs.step, inputs.decode, inputs.indexer)]
    ratios = docs[0].get("model", {}).get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) != measured.model.num_layers:
        raise ProjectionError(f"{inputs.step}: model.compress_ratios must list one ratio per layer")
    shape = StepShape(tuple(int(r) for r in ratios))
    if sum(1 for r in shape.compress_ratios if r == INDEXER_RATIO) != measured.model.indexer_layers:
        raise ProjectionError(f"{inputs.step}: the ratio-{INDEXER_RATIO} layers are not the indexer layers")
    paths = CodePaths.from_docs(docs[1], docs[2])
    f = Factors.of(gpu)
    p = measured.prefill
    prefill = PrefillModel(p.fixed_us * f.bandwidth, p.per_token_us * max(1.0, f.sms), p.chunk_tokens)
    dates = [measured.provenance.date, *(str(d.get("date", ""))[:10] for d in docs)]
    prov = measured.provenance
    provenance = Provenance(
        gpu=f"{gpus.GPUS[gpu].name} (projected from {prov.gpu})",
        date=max(dates),
        torch=prov.torch,
        triton=prov.triton,
        cuda=prov.cuda,
        git_sha=prov.git_sha,
        source=f"projected from {inputs.measured.name} + the decode / indexer code-path benchmarks",
        provisional=True,
        notes=f"{gpus.BASELINES[gpu].note} {NOT_MODELLED}",
        kind="projected",
        method=_method(gpu, f, paths),
        sources=_sources(inputs, measured, docs),
    )
    states = {name: project_state(st, f, paths, shape, gpu) for name, st in measured.states.items()}
    references = {name: ReferenceState(ref.description, False, reason=gpus.FAST_PATH_NOT_MEASURED[gpu])
                  for name, ref in measured.references.items()}  # fmt: skip
    return Calibration(measured.model, prefill, provenance, states, gpu=gpus.GPUS[gpu], baseline=gpus.BASELINES[gpu],
                       references=references)  # fmt: skip


def write_projected(gpu: str, inputs: Inputs | None = None, out: Path | None = None) -> Path:
    """Write ``calibration/<gpu>.json`` (or ``out``); the document is validated before it is written."""
    cal = project_calibration(gpu, inputs)
    return write_calibration(out or GPU_FILES[gpu], model=cal.model, prefill=cal.prefill, provenance=cal.provenance,
                             states=cal.states, gpu=cal.gpu, baseline=cal.baseline,
                             references=cal.references)  # fmt: skip


def stale(gpu: str, inputs: Inputs | None = None) -> str | None:
    """Why the committed ``calibration/<gpu>.json`` differs from what the inputs give now, or None when current."""
    fresh = json.loads(json.dumps(project_calibration(gpu, inputs).to_dict()))
    path = GPU_FILES[gpu]
    try:
        committed = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"{path} is missing or unreadable ({exc})"
    return None if committed == fresh else f"{path} differs from what the measured H200 files give now"
