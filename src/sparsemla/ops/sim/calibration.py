"""Calibration of the simulated sglang server: decode-step time and kernel times per flag state, versioned JSON.

One file describes one GPU's decode step for one model. Per *state* (a variant of the closed set
:data:`sparsemla.variant.VARIANTS`) it holds a grid of measured points:

* ``batch``   — running decode batch sizes B (strictly increasing, >= 1),
* ``context`` — mean context lengths in tokens (strictly increasing, >= 1),
* ``step_us[i][j]``   — wall time of one decode step at ``batch[i]``, ``context[j]`` in microseconds,
* ``kernel_us[name][i][j]`` — GPU time of kernel ``name`` summed over its calls in that step (µs); the sum over
  kernels never exceeds ``step_us`` (the rest is launch gaps / host time),
* ``kernels`` — name, category (``sparsemla.metric_names.KERNEL_CATEGORIES``) and calls per step of each kernel.

Between grid points the simulator interpolates linearly in B and in context; above the largest B it extrapolates along
the last segment (decode cost keeps growing with B), outside the context range it clamps. Prefill ("extend") steps
use ``prefill``: ``fixed_us + per_token_us * tokens`` for a chunk of at most ``chunk_tokens``.

``provenance`` says where the numbers come from (GPU, date, torch/triton/CUDA versions, git sha, source, notes) and
``provisional`` marks a file that was derived rather than measured end to end (see ``provisional.py``). ``kind`` says
how: ``measured`` (the decode-step benchmark on that GPU), ``projected`` (measured on another GPU and scaled, see
``project.py``) or ``derived`` (``provisional.py``); ``method`` says how in words and ``sources`` lists the files the
numbers come from (name, git sha of the code measured, sha256 of the file). A ``projected`` file must carry both.

``gpu`` names the GPU the file describes (key, name, arch, SMs, DRAM bandwidth, the code path our kernels take there)
and ``baseline`` what the ``baseline`` state ("flags off") models on it: which sglang path, what stock sglang 0.5.23
runs there by default and whether the file models that default. Each state may carry a ``description``. These blocks
are optional when reading (older files lack them) and required in a ``projected`` file.

``references`` (optional) maps *reference states* of the decode-step benchmark (``flashmla_decode+triton_indexer``:
sglang's own fast decode on Hopper) to what was measured of them: a ``description``, ``measured``, and either
``step_us`` and ``flags_on_speedup`` (``{context: {batch: value}}`` at the measured points; the speed-up is the
reference's step time / the flags-on state's, both the benchmark's median replay) or a ``reason`` why not. A reference
is never a simulator state (its name may not be a flag variant, and :meth:`Calibration.state` never serves it): it is
what reports compare flags on with. Only a ``measured`` file may carry a measured reference.

Writers (the GPU decode-step benchmark, the projection) call :func:`write_calibration`; readers call
:func:`load_calibration`, which validates everything and raises :class:`CalibrationError` with the JSON path of the
first problem. Path resolution (:func:`resolve_path`): an explicit path or GPU (``sparsemla sim --calibration`` /
``--gpu``), else ``SPARSEMLA_SIM_CALIBRATION``, else the file of ``SPARSEMLA_SIM_GPU`` (default ``h200``:
``calibration/default.json`` when the benchmark has produced it, else the shipped ``calibration/provisional.json``;
the other GPUs: ``calibration/<gpu>.json``).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sparsemla import flags
from sparsemla.artifacts import write_json_atomic
from sparsemla.metric_names import KERNEL_CATEGORIES
from sparsemla.variant import ALL_ON, BASELINE, VARIANTS

SCHEMA_VERSION = 1
CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration"
DEFAULT_PATH = CALIBRATION_DIR / "default.json"
PROVISIONAL_PATH = CALIBRATION_DIR / "provisional.json"
KINDS = ("measured", "projected", "derived")
# The GPUs `sparsemla sim --gpu` / SPARSEMLA_SIM_GPU select (flags.SIM_GPUS); h200 is the measured default.json.
GPU_FILES: dict[str, Path] = {
    "h200": DEFAULT_PATH,
    "rtx-pro-6000": CALIBRATION_DIR / "rtx-pro-6000.json",
    "l40s": CALIBRATION_DIR / "l40s.json",
    "a100": CALIBRATION_DIR / "a100.json",
}


# Multi-GPU servers (`sparsemla sim --gpus 8 --tp 8` / `--dp-attention`): measured by `python -m benchmarks.step
# --ranks 8` and written by `python -m sparsemla.ops.sim.calibrate_ranks`. Nothing is projected for them: a missing
# file is refused (CalibrationAbsent), never replaced by the 1-GPU one.
DEPLOYMENT_FILES: dict[tuple[str, int, str], Path] = {
    ("h200", 8, "tp"): CALIBRATION_DIR / "h200x8-tp8.json",
    ("h200", 8, "dp-attention"): CALIBRATION_DIR / "h200x8-dp-attention-ep8.json",
}


class CalibrationError(ValueError):
    """A calibration file is missing, malformed or inconsistent; the message names the file and the field."""


class CalibrationAbsent(CalibrationError):
    """No measured calibration exists for the asked multi-GPU deployment; ``hint`` says what to run."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Deployment:
    """The server a multi-GPU file describes: GPUs, TP size, DP attention (then EP = GPUs), and what the ``batch``
    axis counts (``server``: the whole server's running requests, N x the per-rank B under DP attention)."""

    gpus: int
    tp: int
    dp_attention: bool
    ep: int
    batch_axis: str


@dataclass(frozen=True)
class ModelSpec:
    """The model and deployment the numbers describe."""

    name: str
    num_layers: int
    indexer_layers: int
    context_length: int  # the server's --context-length the step times were measured with (indexer page-table width)


@dataclass(frozen=True)
class PrefillModel:
    """Duration of one prefill (extend) step: ``fixed_us + per_token_us * tokens``, tokens <= ``chunk_tokens``."""

    fixed_us: float
    per_token_us: float
    chunk_tokens: int

    def step_seconds(self, tokens: int) -> float:
        return (self.fixed_us + self.per_token_us * tokens) * 1e-6


@dataclass(frozen=True)
class Source:
    """One file the numbers come from: its name, the git sha of the code it measured, its sha256, what it is."""

    path: str
    git_sha: str
    sha256: str
    what: str


@dataclass(frozen=True)
class Provenance:
    """Where the numbers come from. ``provisional`` is True for files not measured end to end on their GPU
    (``kind`` ``derived`` or ``projected``); ``kind`` "" means: from ``provisional`` (an older file)."""

    gpu: str
    date: str
    torch: str
    triton: str
    cuda: str
    git_sha: str
    source: str
    provisional: bool
    notes: str = ""
    kind: str = ""
    method: str = ""
    sources: tuple[Source, ...] = ()

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", "derived" if self.provisional else "measured")
        if self.kind not in KINDS:
            raise ValueError(f"provenance kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.provisional != (self.kind != "measured"):
            raise ValueError(f"provenance: provisional={self.provisional} contradicts kind={self.kind!r}")


@dataclass(frozen=True)
class GpuInfo:
    """The GPU a file describes: ``key`` as ``sparsemla sim --gpu`` takes it, DRAM bandwidth in TB/s, and the code path
    our kernels take there (``wgmma`` on Hopper; ``mma.sync`` = the sm_89 path on sm_80..sm_120)."""

    key: str
    name: str
    arch: str
    sms: int
    bandwidth_tb_s: float
    code_path: str


@dataclass(frozen=True)
class BaselineInfo:
    """What the ``baseline`` state (all flags off) models on this GPU: ``label`` (short, for reports), the sglang path
    it runs (``sglang_path``), what stock sglang 0.5.23 runs there by default (``sglang_default``), whether the file
    models that default (``models_default``) and what is and is not modelled (``note``)."""

    label: str
    sglang_path: str
    sglang_default: str
    models_default: bool
    note: str


@dataclass(frozen=True)
class ReferenceState:
    """A reference state of the decode-step benchmark (sglang's own fast path, e.g. FlashMLA's decode): never served
    by the simulator, only compared with. ``step_us`` and ``flags_on_speedup`` map context -> batch -> value at the
    measured points (the speed-up = this state's step time / the flags-on state's, > 1: flags on are faster); a
    reference that was not measured has neither and a ``reason`` in words."""

    description: str
    measured: bool
    step_us: dict[int, dict[int, float]] = field(default_factory=dict)
    flags_on_speedup: dict[int, dict[int, float]] = field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        if self.measured and not self.step_us:
            raise ValueError("a measured reference state needs its step times")
        if not self.measured and (self.step_us or self.flags_on_speedup or not self.reason.strip()):
            raise ValueError("a reference state that was not measured has no step times and says why (reason)")

    def speedups_at(self, batch: int) -> list[tuple[int, float]]:
        """(context, flags-on speed-up over this state) at ``batch``, by context; [] where it was not measured."""
        return [(c, row[batch]) for c, row in sorted(self.flags_on_speedup.items()) if batch in row]

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"description": self.description, "measured": self.measured}
        if self.measured:
            doc["step_us"] = _points_dict(self.step_us, 3)
            doc["flags_on_speedup"] = _points_dict(self.flags_on_speedup, 4)
        else:
            doc["reason"] = self.reason
        return doc


def _points_dict(points: Mapping[int, Mapping[int, float]], digits: int) -> dict[str, dict[str, float]]:
    return {str(c): {str(b): round(v, digits) for b, v in sorted(row.items())} for c, row in sorted(points.items())}


@dataclass(frozen=True)
class KernelSpec:
    """One GPU kernel of a decode step: trace name, category for kernel shares, launches per step."""

    name: str
    category: str
    calls_per_step: int


def _interp_index(axis: Sequence[float], x: float, extrapolate: bool) -> tuple[int, float]:
    """Segment index i and weight w so that value = v[i] * (1 - w) + v[i + 1] * w (single-point axes: (0, 0))."""
    if len(axis) == 1:
        return 0, 0.0
    if x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        i = len(axis) - 2
        if not extrapolate:
            return i, 1.0
        return i, (x - axis[i]) / (axis[i + 1] - axis[i])
    i = bisect.bisect_right(axis, x) - 1
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def _bilinear(
    grid: Sequence[Sequence[float]], batch: Sequence[int], context: Sequence[int], b: float, c: float
) -> float:
    i, wb = _interp_index(batch, b, extrapolate=True)
    j, wc = _interp_index(context, c, extrapolate=False)

    def row(k: int) -> float:
        values = grid[k]
        return values[j] if len(context) == 1 else values[j] * (1 - wc) + values[j + 1] * wc

    value = row(i) if len(batch) == 1 else row(i) * (1 - wb) + row(i + 1) * wb
    return max(value, 0.0)


@dataclass(frozen=True)
class StateCalibration:
    """Step and kernel times of one flag state on a (batch x context) grid (see the module docstring)."""

    variant: str
    flags: dict[str, str]
    batch: tuple[int, ...]
    context: tuple[int, ...]
    step_us: tuple[tuple[float, ...], ...]
    kernels: tuple[KernelSpec, ...]
    kernel_us: dict[str, tuple[tuple[float, ...], ...]]
    description: str = ""  # which sglang path / kernels this state runs on the file's GPU

    def step_seconds(self, batch: int, context: float) -> float:
        """Decode step duration in seconds for ``batch`` running requests of mean context ``context`` tokens."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        return _bilinear(self.step_us, self.batch, self.context, batch, context) * 1e-6

    def kernel_times_us(self, batch: int, context: float) -> dict[str, float]:
        """GPU time per kernel name (µs, summed over its calls) in one decode step at (batch, context)."""
        return {
            k.name: _bilinear(self.kernel_us[k.name], self.batch, self.context, batch, context) for k in self.kernels
        }

    def kernel_shares(self, batch: int, context: float) -> dict[str, tuple[str, float]]:
        """Kernel name -> (category, share of the step's total kernel time), shares summing to 1."""
        times = self.kernel_times_us(batch, context)
        total = sum(times.values()) or 1.0
        return {k.name: (k.category, times[k.name] / total) for k in self.kernels}


@dataclass(frozen=True)
class Calibration:
    """A whole calibration file (see the module docstring); ``path`` is where it was loaded from (or None)."""

    model: ModelSpec
    prefill: PrefillModel
    provenance: Provenance
    states: dict[str, StateCalibration]
    schema_version: int = SCHEMA_VERSION
    path: Path | None = field(default=None, compare=False)
    gpu: GpuInfo | None = None
    baseline: BaselineInfo | None = None
    deployment: Deployment | None = None  # None: one GPU
    references: dict[str, ReferenceState] = field(default_factory=dict)  # compared with, never served

    @property
    def kind(self) -> str:
        """``measured``, ``projected`` or ``derived`` (see :class:`Provenance`)."""
        return self.provenance.kind

    def label(self) -> str:
        """One line for logs and reports: GPU, measured/PROJECTED/PROVISIONAL, and what "flags off" is."""
        gpu = self.gpu.name if self.gpu else self.provenance.gpu
        how = {"measured": "measured", "projected": "PROJECTED (not measured on this GPU)",
               "derived": "PROVISIONAL (derived, not measured end to end)"}[self.kind]  # fmt: skip
        off = f"; flags off = {self.baseline.label}" if self.baseline else ""
        d = self.deployment
        if d is not None:
            gpu = f"{d.gpus}x {gpu} ({f'DP-attention + EP {d.ep}' if d.dp_attention else f'TP {d.tp}'})"
        return f"{gpu} calibration, {how}{off}"

    def state(self, variant: str) -> StateCalibration:
        """The state for a ``variant`` label; CalibrationError naming the file and the states it has otherwise."""
        try:
            return self.states[variant]
        except KeyError:
            raise CalibrationError(
                f"calibration {self.path or '<memory>'} has no state {variant!r} (it has: {', '.join(self.states)})"
            ) from None

    @property
    def flags_on(self) -> str:
        """The flags-on state: all flags on, or a file's one state (DeepSeek-V3.2's calibration holds only its
        flags-on state, ``triton_indexer``: SPARSEMLA_DSA_V32 is no variant switch)."""
        if ALL_ON not in self.states and len(self.states) == 1:
            return next(iter(self.states))
        return ALL_ON

    def flags_on_speedup(self, over: str = BASELINE) -> dict[int, dict[int, float]]:
        """Step time of state ``over`` / the flags-on state's (interpolated where the grids differ) at ``over``'s
        grid points, context -> batch -> ratio: the calibrated decode-step speed-up of flags on over sglang's fallback
        (``baseline``); {} when the file lacks either state."""
        if over not in self.states or self.flags_on not in self.states:
            return {}
        base, on = self.states[over], self.states[self.flags_on]
        return {c: {b: base.step_seconds(b, c) / on.step_seconds(b, c) for b in base.batch} for c in base.context}

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema version :data:`SCHEMA_VERSION`)."""
        doc: dict[str, Any] = {
            "schema_version": self.schema_version,
            "model": asdict(self.model),
            "prefill": asdict(self.prefill),
            "provenance": _provenance_dict(self.provenance),
        }
        if self.gpu is not None:
            doc["gpu"] = asdict(self.gpu)
        if self.baseline is not None:
            doc["baseline"] = asdict(self.baseline)
        if self.deployment is not None:
            doc["deployment"] = asdict(self.deployment)
        if self.references:
            doc["references"] = {name: r.to_dict() for name, r in self.references.items()}
        doc["states"] = {name: _state_dict(s) for name, s in self.states.items()}
        return doc

    def summary(self) -> dict[str, Any]:
        """What `/server_info` shows: file, schema, kind (measured / projected / derived), label, GPU, what the
        baseline models, model, provenance, states and their descriptions, flags on's calibrated speed-up over the
        baseline (sglang's fallback) at its grid points, and the reference states (sglang's fast path: measured step
        times and the flags-on speed-up over them, or why there are none; never served)."""
        return {
            "path": str(self.path) if self.path else None,
            "schema_version": self.schema_version,
            "kind": self.kind,
            "label": self.label(),
            "gpu": asdict(self.gpu) if self.gpu else None,
            "baseline": asdict(self.baseline) if self.baseline else None,
            "deployment": asdict(self.deployment) if self.deployment else None,
            "model": asdict(self.model),
            "provenance": _provenance_dict(self.provenance),
            "states": sorted(self.states),
            "state_descriptions": {n: s.description for n, s in sorted(self.states.items()) if s.description},
            "flags_on": self.flags_on,
            "flags_on_speedup_over_baseline": _points_dict(self.flags_on_speedup(), 4),
            "references": {name: r.to_dict() for name, r in self.references.items()},
        }


def _provenance_dict(p: Provenance) -> dict[str, Any]:
    doc = asdict(p)
    doc["sources"] = [asdict(s) for s in p.sources]
    return doc


def _state_dict(s: StateCalibration) -> dict[str, Any]:
    doc: dict[str, Any] = {"description": s.description} if s.description else {}
    doc.update(
        flags=dict(s.flags),
        batch=list(s.batch),
        context=list(s.context),
        step_us=[[round(v, 3) for v in row] for row in s.step_us],
        kernels=[asdict(k) for k in s.kernels],
        kernel_us={n: [[round(v, 3) for v in row] for row in g] for n, g in s.kernel_us.items()},
    )
    return doc


# -- validation -----------------------------------------------------------------------------------------------------


class _Checker:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, msg: str) -> CalibrationError:
        return CalibrationError(f"{self.where}: {path}: {msg}")

    def obj(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(path, f"expected an object, got {type(value).__name__}")
        return value

    def get(self, parent: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in parent:
            raise self.fail(f"{path}.{key}", "missing")
        return parent[key]

    def string(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        value = self.get(parent, key, path)
        if not isinstance(value, str):
            raise self.fail(f"{path}.{key}", f"expected a string, got {value!r}")
        return value

    def integer(self, parent: Mapping[str, Any], key: str, path: str, minimum: int = 0) -> int:
        value = self.get(parent, key, path)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{path}.{key}", f"expected an integer >= {minimum}, got {value!r}")
        return value

    def number(self, value: Any, path: str, minimum: float = 0.0) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < minimum
        ):
            raise self.fail(path, f"expected a finite number >= {minimum}, got {value!r}")
        return float(value)

    def axis(self, value: Any, path: str) -> tuple[int, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(path, "expected a non-empty list of integers")
        for k, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise self.fail(f"{path}[{k}]", f"expected an integer >= 1, got {v!r}")
        if any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise self.fail(path, f"must be strictly increasing, got {value}")
        return tuple(value)

    def grid(self, value: Any, path: str, rows: int, cols: int, positive: bool) -> tuple[tuple[float, ...], ...]:
        if not isinstance(value, list) or len(value) != rows:
            raise self.fail(path, f"expected {rows} rows (one per batch size)")
        out = []
        for i, row in enumerate(value):
            if not isinstance(row, list) or len(row) != cols:
                raise self.fail(f"{path}[{i}]", f"expected {cols} values (one per context length)")
            minimum = 1e-9 if positive else 0.0
            out.append(tuple(self.number(v, f"{path}[{i}][{j}]", minimum) for j, v in enumerate(row)))
        return tuple(out)


def calibration_from_dict(doc: Any, where: str = "<calibration>") -> Calibration:
    """Validate a parsed JSON document and build a :class:`Calibration`; CalibrationError on the first problem."""
    ck = _Checker(where)
    doc = ck.obj(doc, "$")
    version = ck.get(doc, "schema_version", "$")
    if version != SCHEMA_VERSION:
        raise ck.fail("$.schema_version", f"this simulator reads schema {SCHEMA_VERSION}, the file has {version!r}")
    m = ck.obj(ck.get(doc, "model", "$"), "$.model")
    model = ModelSpec(
        name=ck.string(m, "name", "$.model"),
        num_layers=ck.integer(m, "num_layers", "$.model", 1),
        indexer_layers=ck.integer(m, "indexer_layers", "$.model", 0),
        context_length=ck.integer(m, "context_length", "$.model", 1),
    )
    if model.indexer_layers > model.num_layers:
        raise ck.fail("$.model.indexer_layers", "cannot exceed num_layers")
    p = ck.obj(ck.get(doc, "prefill", "$"), "$.prefill")
    prefill = PrefillModel(
        fixed_us=ck.number(ck.get(p, "fixed_us", "$.prefill"), "$.prefill.fixed_us"),
        per_token_us=ck.number(ck.get(p, "per_token_us", "$.prefill"), "$.prefill.per_token_us", 1e-9),
        chunk_tokens=ck.integer(p, "chunk_tokens", "$.prefill", 1),
    )
    provenance = _provenance(ck, ck.obj(ck.get(doc, "provenance", "$"), "$.provenance"))
    gpu = _gpu(ck, ck.obj(doc["gpu"], "$.gpu")) if "gpu" in doc else None
    baseline = _baseline(ck, ck.obj(doc["baseline"], "$.baseline")) if "baseline" in doc else None
    deployment = _deployment(ck, ck.obj(doc["deployment"], "$.deployment")) if "deployment" in doc else None
    if provenance.kind == "projected":
        for key, value in (("gpu", gpu), ("baseline", baseline)):
            if value is None:
                raise ck.fail(f"$.{key}", "missing (a projected file must say which GPU and which baseline it models)")
    refs_doc = ck.obj(doc["references"], "$.references") if "references" in doc else {}
    references = _references(ck, refs_doc, provenance.kind)
    states_doc = ck.obj(ck.get(doc, "states", "$"), "$.states")
    if not states_doc:
        raise ck.fail("$.states", "no states")
    states = {}
    for name, raw in states_doc.items():
        path = f"$.states[{name!r}]"
        if name not in VARIANTS:
            raise ck.fail(path, f"unknown state; expected one of {', '.join(VARIANTS)}")
        s = ck.obj(raw, path)
        batch = ck.axis(ck.get(s, "batch", path), f"{path}.batch")
        context = ck.axis(ck.get(s, "context", path), f"{path}.context")
        step = ck.grid(ck.get(s, "step_us", path), f"{path}.step_us", len(batch), len(context), positive=True)
        kernels_doc = ck.get(s, "kernels", path)
        if not isinstance(kernels_doc, list) or not kernels_doc:
            raise ck.fail(f"{path}.kernels", "expected a non-empty list")
        kernels = []
        for k, kd in enumerate(kernels_doc):
            kp = f"{path}.kernels[{k}]"
            kd = ck.obj(kd, kp)
            spec = KernelSpec(
                ck.string(kd, "name", kp), ck.string(kd, "category", kp), ck.integer(kd, "calls_per_step", kp, 1)
            )
            if spec.category not in KERNEL_CATEGORIES:
                raise ck.fail(f"{kp}.category", f"{spec.category!r} is not one of {', '.join(KERNEL_CATEGORIES)}")
            kernels.append(spec)
        names = [k.name for k in kernels]
        if len(set(names)) != len(names):
            raise ck.fail(f"{path}.kernels", "duplicate kernel names")
        ku_doc = ck.obj(ck.get(s, "kernel_us", path), f"{path}.kernel_us")
        if set(ku_doc) != set(names):
            raise ck.fail(f"{path}.kernel_us", f"keys must be exactly the kernel names {names}, got {sorted(ku_doc)}")
        kernel_us = {
            n: ck.grid(ku_doc[n], f"{path}.kernel_us[{n!r}]", len(batch), len(context), positive=False) for n in names
        }
        for i in range(len(batch)):
            for j in range(len(context)):
                total = sum(kernel_us[n][i][j] for n in names)
                if total > step[i][j] * (1 + 1e-6) + 1e-3 * len(names):  # slack: values are rounded to 1 ns
                    raise ck.fail(
                        f"{path}.kernel_us",
                        f"kernel times sum to {total:.1f} us at batch={batch[i]}, context={context[j]}, more than "
                        f"step_us={step[i][j]:.1f}",
                    )
        flags_doc = ck.obj(ck.get(s, "flags", path), f"{path}.flags")
        description = ck.string(s, "description", path) if "description" in s else ""
        states[name] = StateCalibration(
            name, {str(k): str(v) for k, v in flags_doc.items()}, batch, context, step, tuple(kernels), kernel_us,
            description,
        )  # fmt: skip
    return Calibration(
        model, prefill, provenance, states, SCHEMA_VERSION, gpu=gpu, baseline=baseline, deployment=deployment,
        references=references,
    )  # fmt: skip


def _points(ck: _Checker, value: Any, path: str, minimum: float) -> dict[int, dict[int, float]]:
    """``{context: {batch: number}}`` with integer keys >= 1 written as strings (JSON object keys)."""

    def key(k: str, where: str) -> int:
        if not (isinstance(k, str) and k.isdigit() and int(k) >= 1):
            raise ck.fail(where, f"keys must be integers >= 1 written as strings, got {k!r}")
        return int(k)

    out: dict[int, dict[int, float]] = {}
    for c, row in ck.obj(value, path).items():
        cp = f"{path}[{c!r}]"
        values = {key(b, cp): ck.number(v, f"{cp}[{b!r}]", minimum) for b, v in ck.obj(row, cp).items()}
        if not values:
            raise ck.fail(cp, "no batch sizes")
        out[key(c, path)] = values
    return out


def _references(ck: _Checker, refs: Mapping[str, Any], kind: str) -> dict[str, ReferenceState]:
    out = {}
    for name, raw in refs.items():
        path = f"$.references[{name!r}]"
        if name in VARIANTS:
            raise ck.fail(path, "a reference state cannot be a flag state (the simulator serves those)")
        r = ck.obj(raw, path)
        measured = ck.get(r, "measured", path)
        if not isinstance(measured, bool):
            raise ck.fail(f"{path}.measured", f"expected true or false, got {measured!r}")
        description = ck.string(r, "description", path)
        if not measured:
            for key in ("step_us", "flags_on_speedup"):
                if key in r:
                    raise ck.fail(f"{path}.{key}", "a reference that was not measured has no numbers")
            reason = ck.string(r, "reason", path)
            if not reason.strip():
                raise ck.fail(f"{path}.reason", "say why the reference was not measured")
            out[name] = ReferenceState(description, False, reason=reason)
            continue
        if kind != "measured":
            raise ck.fail(f"{path}.measured", f"a {kind} file cannot carry a measured reference state")
        step = _points(ck, ck.get(r, "step_us", path), f"{path}.step_us", 1e-9)
        if not step:
            raise ck.fail(f"{path}.step_us", "a measured reference needs its step times")
        speedup = _points(ck, ck.get(r, "flags_on_speedup", path), f"{path}.flags_on_speedup", 1e-9)
        for c, row in speedup.items():
            extra = sorted(set(row) - set(step.get(c, {})))
            if extra:
                raise ck.fail(f"{path}.flags_on_speedup[{str(c)!r}]", f"batch sizes {extra} have no step_us")
        out[name] = ReferenceState(description, True, step, speedup)
    return out


def _provenance(ck: _Checker, pv: Mapping[str, Any]) -> Provenance:
    where = "$.provenance"
    provisional = ck.get(pv, "provisional", where)
    if not isinstance(provisional, bool):
        raise ck.fail(f"{where}.provisional", f"expected true or false, got {provisional!r}")
    kind = ck.string(pv, "kind", where) if "kind" in pv else ""
    if kind and kind not in KINDS:
        raise ck.fail(f"{where}.kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    if kind and provisional != (kind != "measured"):
        raise ck.fail(f"{where}.provisional", f"{provisional} contradicts kind {kind!r} (true unless measured)")
    sources_doc = ck.get(pv, "sources", where) if "sources" in pv else []
    if not isinstance(sources_doc, list):
        raise ck.fail(f"{where}.sources", "expected a list")
    sources = []
    for i, raw in enumerate(sources_doc):
        sp = f"{where}.sources[{i}]"
        sd = ck.obj(raw, sp)
        sources.append(Source(*(ck.string(sd, k, sp) for k in ("path", "git_sha", "sha256", "what"))))
    method = ck.string(pv, "method", where) if "method" in pv else ""
    if kind == "projected" and (not method.strip() or not sources):
        raise ck.fail(where, "a projected file must say its method and list its sources")
    return Provenance(
        **{k: ck.string(pv, k, where) for k in ("gpu", "date", "torch", "triton", "cuda", "git_sha", "source")},
        provisional=provisional,
        notes=ck.string(pv, "notes", where) if "notes" in pv else "",
        kind=kind,
        method=method,
        sources=tuple(sources),
    )


def _gpu(ck: _Checker, g: Mapping[str, Any]) -> GpuInfo:
    where = "$.gpu"
    bandwidth = ck.number(ck.get(g, "bandwidth_tb_s", where), f"{where}.bandwidth_tb_s", 1e-9)
    return GpuInfo(
        key=ck.string(g, "key", where),
        name=ck.string(g, "name", where),
        arch=ck.string(g, "arch", where),
        sms=ck.integer(g, "sms", where, 1),
        bandwidth_tb_s=bandwidth,
        code_path=ck.string(g, "code_path", where),
    )


def _baseline(ck: _Checker, b: Mapping[str, Any]) -> BaselineInfo:
    where = "$.baseline"
    models_default = ck.get(b, "models_default", where)
    if not isinstance(models_default, bool):
        raise ck.fail(f"{where}.models_default", f"expected true or false, got {models_default!r}")
    label, path, default, note = (ck.string(b, k, where) for k in ("label", "sglang_path", "sglang_default", "note"))
    return BaselineInfo(label, path, default, models_default, note)


def _deployment(ck: _Checker, d: Mapping[str, Any]) -> Deployment:
    where = "$.deployment"
    dp = ck.get(d, "dp_attention", where)
    if not isinstance(dp, bool):
        raise ck.fail(f"{where}.dp_attention", f"expected true or false, got {dp!r}")
    gpus, tp, ep = (ck.integer(d, k, where, 1) for k in ("gpus", "tp", "ep"))
    axis = ck.string(d, "batch_axis", where)
    if axis != "server":
        raise ck.fail(f"{where}.batch_axis", f"expected 'server', got {axis!r}")
    return Deployment(gpus, tp, dp, ep, axis)


def deployment_path(gpu: str, gpus: int, deployment: str) -> Path:
    """The measured file of a multi-GPU server (:data:`DEPLOYMENT_FILES`); CalibrationAbsent (with what to run) when
    the deployment is unknown or not measured yet."""
    key = (gpu.strip().lower(), gpus, deployment)
    run = (
        f"measure it: `python -m benchmarks.step --ranks {gpus} --deployment {deployment}` on a {gpus}-GPU "
        f"{gpu.upper()} machine (docs/performance.md, decode step: the device command), then "
        f"`python -m sparsemla.ops.sim.calibrate_ranks RESULT.json`"
    )
    if key not in DEPLOYMENT_FILES:
        known = ", ".join(f"--gpu {g} --gpus {n} {'--tp ' + str(n) if d == 'tp' else '--dp-attention'}"
                          for g, n, d in DEPLOYMENT_FILES)  # fmt: skip
        raise CalibrationAbsent(f"no {gpus}-GPU {deployment} calibration is defined for {gpu}", f"known: {known}")
    path = DEPLOYMENT_FILES[key]
    if not path.is_file():
        raise CalibrationAbsent(
            f"no {gpus}-GPU calibration is measured for {gpu} {deployment} ({path.name} is absent); the simulator "
            "does not project one from the 1-GPU step",
            run,
        )
    return path


def gpu_path(gpu: str) -> Path:
    """The shipped file of a GPU key (:data:`GPU_FILES`): h200 is default.json (measured; provisional.json until the
    decode-step benchmark has written it), the others their projected ``<gpu>.json``."""
    key = gpu.strip().lower()
    if key not in GPU_FILES:
        raise CalibrationError(f"unknown GPU {gpu!r}; the simulator has calibrations for {', '.join(GPU_FILES)}")
    path = GPU_FILES[key]
    return PROVISIONAL_PATH if key == "h200" and not path.is_file() else path


def resolve_path(path: str | Path | None = None, gpu: str | None = None) -> Path:
    """The file to use: ``path`` or ``gpu`` (not both), else ``SPARSEMLA_SIM_CALIBRATION``, else the file of
    ``SPARSEMLA_SIM_GPU`` (see :func:`gpu_path`; default h200). Both variables set is an error: they disagree."""
    if path is not None and gpu is not None:
        raise CalibrationError("give a calibration file or a GPU, not both (--calibration or --gpu)")
    if path is not None:
        return Path(path)
    if gpu is not None:
        return gpu_path(gpu)
    configured = flags.SPARSEMLA_SIM_CALIBRATION.get()
    if configured and flags.SPARSEMLA_SIM_GPU.is_set():
        raise CalibrationError(
            f"SPARSEMLA_SIM_CALIBRATION={configured} and SPARSEMLA_SIM_GPU={flags.SPARSEMLA_SIM_GPU.get()} are both "
            "set; unset one of them"
        )
    if configured:
        return Path(configured)
    return gpu_path(flags.SPARSEMLA_SIM_GPU.get())


def load_calibration(path: str | Path | None = None, gpu: str | None = None) -> Calibration:
    """Read and validate a calibration file (see :func:`resolve_path`); CalibrationError with a clear message."""
    resolved = resolve_path(path, gpu)
    try:
        text = resolved.read_text()
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration {resolved}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{resolved}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return replace(calibration_from_dict(doc, str(resolved)), path=resolved)


def write_calibration(
    path: str | Path,
    *,
    model: ModelSpec,
    prefill: PrefillModel,
    provenance: Provenance,
    states: Mapping[str, StateCalibration],
    gpu: GpuInfo | None = None,
    baseline: BaselineInfo | None = None,
    deployment: Deployment | None = None,
    references: Mapping[str, ReferenceState] | None = None,
) -> Path:
    """Validate and write a calibration JSON atomically (the decode-step benchmark's output: ``default.json``; the
    projection's ``<gpu>.json``).

    ``states`` maps variant names to :class:`StateCalibration`; the document is checked exactly like
    :func:`load_calibration` checks it before anything is written. Returns the path written."""
    cal = Calibration(model, prefill, provenance, dict(states), gpu=gpu, baseline=baseline, deployment=deployment,
                      references=dict(references or {}))  # fmt: skip
    doc = cal.to_dict()
    calibration_from_dict(doc, f"write_calibration({path})")  # refuse to write what could not be loaded
    return write_json_atomic(Path(path), doc, indent=1)
