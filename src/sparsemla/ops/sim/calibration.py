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
``provisional`` marks a file that was derived rather than measured end to end (see ``provisional.py``).

Writers (the GPU decode-step benchmark) call :func:`write_calibration`; readers call :func:`load_calibration`, which
validates everything and raises :class:`CalibrationError` with the JSON path of the first problem. Path resolution:
``SPARSEMLA_SIM_CALIBRATION`` if set, else ``calibration/default.json`` when the benchmark has produced it, else the
shipped ``calibration/provisional.json``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparsemla import flags
from sparsemla.artifacts import write_json_atomic
from sparsemla.metric_names import KERNEL_CATEGORIES
from sparsemla.variant import VARIANTS

SCHEMA_VERSION = 1
CALIBRATION_DIR = Path(__file__).resolve().parent / "calibration"
DEFAULT_PATH = CALIBRATION_DIR / "default.json"
PROVISIONAL_PATH = CALIBRATION_DIR / "provisional.json"


class CalibrationError(ValueError):
    """A calibration file is missing, malformed or inconsistent; the message names the file and the field."""


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
class Provenance:
    """Where the numbers come from. ``provisional`` is True for derived (not end-to-end measured) files."""

    gpu: str
    date: str
    torch: str
    triton: str
    cuda: str
    git_sha: str
    source: str
    provisional: bool
    notes: str = ""


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

    def state(self, variant: str) -> StateCalibration:
        """The state for a ``variant`` label; CalibrationError naming the file and the states it has otherwise."""
        try:
            return self.states[variant]
        except KeyError:
            raise CalibrationError(
                f"calibration {self.path or '<memory>'} has no state {variant!r} (it has: {', '.join(self.states)})"
            ) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (schema version :data:`SCHEMA_VERSION`)."""
        return {
            "schema_version": self.schema_version,
            "model": asdict(self.model),
            "prefill": asdict(self.prefill),
            "provenance": asdict(self.provenance),
            "states": {
                name: {
                    "flags": dict(s.flags),
                    "batch": list(s.batch),
                    "context": list(s.context),
                    "step_us": [[round(v, 3) for v in row] for row in s.step_us],
                    "kernels": [asdict(k) for k in s.kernels],
                    "kernel_us": {n: [[round(v, 3) for v in row] for row in g] for n, g in s.kernel_us.items()},
                }
                for name, s in self.states.items()
            },
        }

    def summary(self) -> dict[str, Any]:
        """What `/server_info` shows: file, schema, model, provenance, states."""
        return {
            "path": str(self.path) if self.path else None,
            "schema_version": self.schema_version,
            "model": asdict(self.model),
            "provenance": asdict(self.provenance),
            "states": sorted(self.states),
        }


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
    pv = ck.obj(ck.get(doc, "provenance", "$"), "$.provenance")
    provisional = ck.get(pv, "provisional", "$.provenance")
    if not isinstance(provisional, bool):
        raise ck.fail("$.provenance.provisional", f"expected true or false, got {provisional!r}")
    provenance = Provenance(
        **{
            k: ck.string(pv, k, "$.provenance") for k in ("gpu", "date", "torch", "triton", "cuda", "git_sha", "source")
        },
        provisional=provisional,
        notes=ck.string(pv, "notes", "$.provenance") if "notes" in pv else "",
    )
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
        states[name] = StateCalibration(
            name, {str(k): str(v) for k, v in flags_doc.items()}, batch, context, step, tuple(kernels), kernel_us
        )
    return Calibration(model, prefill, provenance, states, SCHEMA_VERSION)


def resolve_path(path: str | Path | None = None) -> Path:
    """The file to use: ``path``, else ``SPARSEMLA_SIM_CALIBRATION``, else default.json, else provisional.json."""
    if path is not None:
        return Path(path)
    configured = flags.SPARSEMLA_SIM_CALIBRATION.get()
    if configured:
        return Path(configured)
    return DEFAULT_PATH if DEFAULT_PATH.is_file() else PROVISIONAL_PATH


def load_calibration(path: str | Path | None = None) -> Calibration:
    """Read and validate a calibration file (see :func:`resolve_path`); CalibrationError with a clear message."""
    resolved = resolve_path(path)
    try:
        text = resolved.read_text()
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration {resolved}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{resolved}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    cal = calibration_from_dict(doc, str(resolved))
    return Calibration(cal.model, cal.prefill, cal.provenance, cal.states, cal.schema_version, resolved)


def write_calibration(
    path: str | Path,
    *,
    model: ModelSpec,
    prefill: PrefillModel,
    provenance: Provenance,
    states: Mapping[str, StateCalibration],
) -> Path:
    """Validate and write a calibration JSON atomically (the decode-step benchmark's output: ``default.json``).

    ``states`` maps variant names to :class:`StateCalibration`; the document is checked exactly like
    :func:`load_calibration` checks it before anything is written. Returns the path written."""
    cal = Calibration(model, prefill, provenance, dict(states))
    doc = cal.to_dict()
    calibration_from_dict(doc, f"write_calibration({path})")  # refuse to write what could not be loaded
    return write_json_atomic(Path(path), doc, indent=1)
