"""Simulator calibration from a decode-step benchmark result: ``python -m sparsemla.ops.sim.calibrate_from_step``.

Reads ``results/bench/step-<gpu>-<date>.json`` (written by ``python -m benchmarks.step`` on a GPU) and
writes ``ops/sim/calibration/default.json`` through :func:`sparsemla.ops.sim.calibration.write_calibration`
(which validates the document before writing). This adapter lives on the deploy side so that ``sparsemla.kernels``
never imports the simulator.

Mapping (schema in :mod:`sparsemla.ops.sim.calibration`):

* ``model``: the benchmark's model (43 layers, 21 with an indexer) and ``context_length`` = the benchmark's cap (the
  server's ``--context-length``, the width the torch indexer scans).
* per state (``variant``), over the contexts at which every measured batch size was timed and profiled (a context with
  a hole is left out and the notes say so; a state with no complete context is left out): ``step_us`` = the median
  CUDA-graph replay time; ``kernel_us[name]`` = that kernel group's GPU time in the profiled replay of the same point
  (0 where it did not run); ``calls_per_step`` = its most launches in one step. Kernel names are the trace parser's
  short names (``name [category]`` when one short name falls in two categories). Where a profiled replay's kernels
  add up to more than the median replay (run-to-run noise), ``step_us`` is raised to that sum (a step cannot be shorter
  than its serial kernels); ``provenance.notes`` counts such points.
* reference states (``references`` / rows whose state is no flag variant, e.g. ``flashmla_decode+triton_indexer``:
  sglang's fast decode on Hopper): never a simulator state (the simulator's states are the flag variants); the
  calibration's ``references`` carry their step times at the measured points and the flags-on speed-up over them
  (the rows' median replays, as the step report and ``speedup_vs_reference`` compute it), or why they are missing,
  and ``provenance.notes`` says the same in a sentence; the calibration of a result with them equals the one without
  them but for those two.
* ``prefill``: the step benchmark measures decode only; the prefill model is carried over from the shipped provisional
  calibration and the notes say so.
* ``provenance.kind`` = ``measured``, ``method`` = the benchmark's method, ``sources`` = the step JSON (its name, the
  git sha it measured, its sha256); ``gpu``, ``baseline`` and each state's ``description`` come from
  :mod:`sparsemla.ops.sim.gpus` when the GPU is one it knows (else ``baseline`` is built from the JSON's ``impl``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from sparsemla import variant as kernel_variant
from sparsemla.ops.sim import gpus
from sparsemla.ops.sim.calibration import (
    DEFAULT_PATH,
    PROVISIONAL_PATH,
    BaselineInfo,
    KernelSpec,
    ModelSpec,
    Provenance,
    ReferenceState,
    Source,
    StateCalibration,
    load_calibration,
    write_calibration,
)

app = typer.Typer(add_completion=False, help=__doc__)
RESULTS_DIR = Path("results/bench")


class StepResultError(ValueError):
    """The step JSON is not a usable decode-step benchmark result; the message says what is missing."""


def _flags(name: str) -> dict[str, str]:
    return kernel_variant.parse(name).flag_labels()


def state_from_step(doc: Mapping[str, Any], variant: str) -> tuple[StateCalibration | None, int, str]:
    """(state or None when its grid is incomplete, points whose step time was raised to the kernel sum, reason)."""
    rows = {(r["B"], r["ctx"]): float(r["us"]) for r in doc["variant_rows"] if r["variant"] == variant}
    if not rows:
        return None, 0, "not measured"
    batch = sorted({b for b, _ in rows})
    shares = doc.get("kernel_share", {}).get(variant, {})

    def complete(c: int) -> bool:
        return all((b, c) in rows and str(b) in shares.get(str(c), {}) for b in batch)

    measured = sorted({c for _, c in rows})
    context = [c for c in measured if complete(c)]
    if not context:
        return None, 0, f"no context with every batch size {batch} timed and profiled"
    dropped = [c for c in measured if c not in context]
    note = f"contexts {dropped} left out (incomplete; the simulator clamps context to {context})" if dropped else ""
    # kernel groups over the grid; a short name in two categories gets its category appended
    cats: dict[str, set[str]] = {}
    for c in context:
        for b in batch:
            for k in shares[str(c)][str(b)]["kernels"]:
                cats.setdefault(k["name"], set()).add(k["category"])

    def key(name: str, category: str) -> str:
        return name if len(cats[name]) == 1 else f"{name} [{category}]"

    times: dict[str, list[list[float]]] = {}
    calls: dict[str, int] = {}
    category: dict[str, str] = {}
    for k_name, k_cats in sorted(cats.items()):
        for cat in sorted(k_cats):
            n = key(k_name, cat)
            times[n] = [[0.0] * len(context) for _ in batch]
            calls[n] = 1
            category[n] = cat
    step = [[rows[(b, c)] for c in context] for b in batch]
    raised = 0
    for i, b in enumerate(batch):
        for j, c in enumerate(context):
            for k in shares[str(c)][str(b)]["kernels"]:
                n = key(k["name"], k["category"])
                times[n][i][j] += float(k["time_us"])
                calls[n] = max(calls[n], int(k["calls"]))
            total = sum(times[n][i][j] for n in times)
            if total > step[i][j]:
                step[i][j] = total
                raised += 1
    order = sorted(times, key=lambda n: -sum(map(sum, times[n])))
    state = StateCalibration(
        variant=variant,
        flags=_flags(variant),
        batch=tuple(batch),
        context=tuple(context),
        step_us=tuple(tuple(r) for r in step),
        kernels=tuple(KernelSpec(n, category[n], calls[n]) for n in order),
        kernel_us={n: tuple(tuple(r) for r in times[n]) for n in order},
    )
    return state, raised, note


def _reference_names(doc: Mapping[str, Any]) -> list[str]:
    """The reference states of a step result: those it declares, then any other non-flag state with rows."""
    declared = doc.get("references", {}) or {}
    rows = {r["variant"] for r in doc["variant_rows"]}
    return list(declared) + sorted({v for v in rows if v not in kernel_variant.VARIANTS} - set(declared))


def references(doc: Mapping[str, Any]) -> dict[str, ReferenceState]:
    """The ``references`` of the calibration: per reference state its step times at the measured points and the
    flags-on speed-up over them (its median replay / flags on's at the same point, from the rows), or why it was not
    measured."""
    rows = {(r["variant"], int(r["ctx"]), int(r["B"])): float(r["us"]) for r in doc["variant_rows"]}
    declared = doc.get("references", {}) or {}
    out = {}
    for name in _reference_names(doc):
        entry = declared.get(name, {})
        description = entry.get("description") or "a reference state of the decode-step benchmark"
        step: dict[int, dict[int, float]] = {}
        speedup: dict[int, dict[int, float]] = {}
        for (v, c, b), us in sorted(rows.items()):
            if v != name:
                continue
            step.setdefault(c, {})[b] = us
            on = rows.get((kernel_variant.ALL_ON, c, b))
            if on:
                speedup.setdefault(c, {})[b] = us / on
        if step:
            out[name] = ReferenceState(description, True, step, speedup)
        else:
            out[name] = ReferenceState(description, False, reason=entry.get("reason") or "no step times in the result")
    return out


def reference_notes(doc: Mapping[str, Any]) -> list[str]:
    """One sentence per reference state of a step result: its measured step times and the flags-on speed-up over
    them, or why it was not measured."""
    rows = {(r["variant"], int(r["ctx"]), int(r["B"])): float(r["us"]) for r in doc["variant_rows"]}
    declared = doc.get("references", {}) or {}
    out = []
    for name in _reference_names(doc):
        entry = declared.get(name, {})
        points = sorted((c, b) for v, c, b in rows if v == name)
        if not points:
            out.append(f"Reference state {name} not measured: {entry.get('reason') or 'no step times in the result'}.")
            continue
        kernels = doc.get("impl", {}).get("states", {}).get(name, {})
        what = "; ".join(f"{k} {kernels[k]}" for k in ("decode", "indexer_logits", "top_k") if k in kernels)
        cells = []
        for c, b in points:
            us = rows[(name, c, b)]
            on = rows.get((kernel_variant.ALL_ON, c, b))
            vs = f" (it / flags on = {us / on:.3f}x)" if on else ""
            cells.append(f"ctx {c} B={b}: {us:.1f} us{vs}")
        out.append(
            f"Reference state {name} ({entry.get('description') or 'a reference state'}"
            f"{'; ' + what if what else ''}), measured in the same run and not a simulator state (the simulator's "
            f"states are the flag variants): step_us {'; '.join(cells)}."
        )
    return out


def _baseline(doc: Mapping[str, Any], gpu_key: str | None) -> BaselineInfo:
    if gpu_key is not None:
        return gpus.BASELINES[gpu_key]
    impl = doc.get("impl", {})
    path = f"{impl.get('baseline_decode', 'unknown decode')} + {impl.get('baseline_indexer', 'unknown indexer')}"
    return BaselineInfo(
        label=path,
        sglang_path=path,
        sglang_default=f"not recorded for {doc['gpu']} (sparsemla.ops.sim.gpus has no entry for it)",
        models_default=False,
        note="Measured by the decode-step benchmark on this GPU; what stock sglang runs here was not recorded.",
    )


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes (the ``sources`` of a calibration pin exactly what was read)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_spec(doc: Mapping[str, Any]) -> ModelSpec:
    """The measured model of a step result (its ``model`` block, context length = the result's ``cap``)."""
    model = doc["model"]
    return ModelSpec(
        name=str(model["name"]),
        num_layers=int(model["num_layers"]),
        indexer_layers=int(model["indexer_layers"]),
        context_length=int(doc["cap"]),
    )


def measured_provenance(
    doc: Mapping[str, Any], source: str, sha256: str, *, what: str, method: str, notes: list[str], described: str
) -> Provenance:
    """Provenance of a calibration measured by a step result: ``what`` names the benchmark (``source`` is
    "<what> (<file name>)"), ``described`` the result file in :class:`Source`."""
    return Provenance(
        gpu=str(doc["gpu"]),
        date=str(doc["date"])[:10],
        torch=str(doc["torch"]),
        triton=str(doc["triton"]),
        cuda=str(doc["cuda"]),
        git_sha=str(doc["git_sha"]),
        source=f"{what} ({Path(source).name})",
        provisional=False,
        notes=" ".join(notes),
        kind="measured",
        method=method,
        sources=(Source(Path(source).name, str(doc["git_sha"]), sha256 or "unknown", described),),
    )


def calibration_args(doc: Mapping[str, Any], source: str, sha256: str = "") -> dict[str, Any]:
    """Keyword arguments of :func:`write_calibration` from a step-benchmark document (``sha256``: of its file)."""
    for key in ("op", "gpu", "git_sha", "date", "torch", "triton", "cuda", "cap", "model", "variant_rows"):
        if key not in doc:
            raise StepResultError(f"{source}: missing {key!r} (is this a step-benchmark result?)")
    if doc["op"] != "step":
        raise StepResultError(f"{source}: op is {doc['op']!r}, expected 'step'")
    states: dict[str, StateCalibration] = {}
    notes: list[str] = []
    raised_total = 0
    for variant in kernel_variant.VARIANTS:
        state, raised, reason = state_from_step(doc, variant)
        if state is None:
            notes.append(f"state {variant} left out: {reason}.")
            continue
        if reason:
            notes.append(f"state {variant}: {reason}.")
        states[variant] = state
        raised_total += raised
    if not states:
        raise StepResultError(f"{source}: no flag state has a complete batch grid of step times and kernel shares")
    model = doc["model"]
    prefill = load_calibration(PROVISIONAL_PATH).prefill
    gpu_key = gpus.gpu_key_for_name(str(doc["gpu"]))
    if gpu_key is not None:
        described = gpus.state_descriptions(gpu_key)
        states = {name: replace(st, description=described[name]) for name, st in states.items()}
    notes.insert(
        0,
        f"Measured by benchmarks/step.py ({model.get('deployment', '')}; {doc.get('method', '')}). "
        f"step_us: median CUDA-graph replay of the whole {model['num_layers']}-layer decode step; kernel_us: the "
        f"profiled replay of the same point. Prefill is not measured by the step benchmark: carried over from "
        f"the provisional calibration (derived). Points whose step time was raised to the profiled kernel sum: "
        f"{raised_total}.",
    )
    notes += reference_notes(doc)
    return {
        "model": model_spec(doc),
        "prefill": prefill,
        "provenance": measured_provenance(
            doc,
            source,
            sha256,
            what="decode-step benchmark",
            method=f"benchmarks/step.py on the GPU: {doc.get('method', '')}",
            notes=notes,
            described="decode-step benchmark result (results/bench/)",
        ),
        "states": states,
        "gpu": gpus.GPUS[gpu_key] if gpu_key is not None else None,
        "baseline": _baseline(doc, gpu_key),
        "references": references(doc),
    }


def latest_result(directory: Path = RESULTS_DIR, pattern: str = "step-*.json") -> Path | None:
    """The newest ``pattern`` file in ``directory`` by name (names end in the date), None when there is none."""
    found = sorted(directory.glob(pattern))
    return found[-1] if found else None


def read_result(step_json: Path) -> dict[str, Any]:
    """A benchmark result's JSON object; StepResultError saying what is wrong with the file otherwise."""
    try:
        doc = json.loads(step_json.read_text())
    except OSError as exc:
        raise StepResultError(f"cannot read {step_json}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise StepResultError(f"{step_json}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise StepResultError(f"{step_json}: expected a JSON object")
    return doc


def calibrate(step_json: Path, out: Path = DEFAULT_PATH) -> Path:
    """Read a step result and write the calibration; StepResultError / CalibrationError on bad input."""
    doc = read_result(step_json)
    return write_calibration(out, **calibration_args(doc, str(step_json), sha256_of(step_json)))


@app.command()
def main(
    step_json: Path = typer.Argument(None, help="Step result (default: newest results/bench/step-*.json)."),
    out: Path = typer.Option(DEFAULT_PATH, help="Calibration file to write."),
) -> None:
    """Write the simulator calibration from a decode-step benchmark result."""
    from sparsemla.console import fail

    path = step_json or latest_result()
    if path is None:
        fail(f"no step-*.json in {RESULTS_DIR}", "run `make bench-step` on a GPU first, or pass the file")
    write_and_report(calibrate, path, out, "pass the JSON written by `python -m benchmarks.step`")


def write_and_report(calibrate_fn: Callable[[Path, Path], Path], path: Path, out: Path, hint: str) -> None:
    """CLI tail of the calibration adapters: ``calibrate_fn(path, out)``, then one line saying what was written; a
    result that cannot be read fails with ``hint`` (exit 2)."""
    from sparsemla.console import fail
    from sparsemla.ops.sim.calibration import CalibrationError

    try:
        written = calibrate_fn(path, out)
    except (StepResultError, CalibrationError) as exc:
        fail(str(exc), hint)
    cal = load_calibration(written)
    refs = f"; reference states (compared with, not served) {', '.join(cal.references)}" if cal.references else ""
    print(f"wrote {written}: states {', '.join(cal.states)}{refs}; {cal.provenance.gpu}, {cal.provenance.date}")


if __name__ == "__main__":
    app()
