"""Simulator calibration of DeepSeek-V3.2 from its decode-step benchmark result:
``python -m sparsemla.ops.sim.calibrate_from_step_v32 [STEP_V32_JSON] [--check]``.

Reads ``results/bench/step_v32-<gpu>-<date>.json`` (written by ``python -m benchmarks.step_v32`` on a GPU; schema in
that module's docstring) and writes ``ops/sim/calibration/deepseek-v3.2-h200.json`` through
:func:`sparsemla.ops.sim.calibration.write_calibration`, the file ``sparsemla sim --model deepseek-v3.2`` serves.
``--check`` writes nothing and exits 1 when the committed file differs from what its source JSON gives.

Mapping (same rules as :mod:`sparsemla.ops.sim.calibrate_from_step`, whose per-state code this reuses):

* the result's ``sparsemla`` state (flags on: ``SPARSEMLA_DSA_V32`` + ``SPARSEMLA_TRITON_INDEXER``) is the one
  simulator state. Its name is the variant those flags report (:func:`sparsemla.variant.current`:
  ``SPARSEMLA_DSA_V32`` is a kernel flag but no variant switch, so they report ``triton_indexer``), so the simulator
  serves it exactly when those flags are set, as the sglang plugin labels such a server. ``step_us`` = the rows'
  median replays, ``kernel_us`` = the profiled replay's kernels (a step is raised to its kernel sum where that is
  larger; ``provenance.notes`` counts such points).
* the ``flashmla`` state (stock sglang on Hopper: FlashMLA's V3.2 decode, our indexer standing in for DeepGEMM's) is a
  reference (``references.flashmla``): its step times at the measured points and the flags-on speed-up over it
  (flashmla / flags on, the JSON's ``speedup``), never served. There is no ``baseline`` state or block: flags off has
  no V3.2 fallback path to measure (the JSON's ``flags_off``, repeated in the notes).
* ``model`` = the result's model, ``context_length`` = its ``cap``; ``prefill``: the step benchmark measures decode
  only, so the shipped provisional (DeepSeek-V4-Flash, derived) prefill model is carried over and the notes say so.
* ``provenance.kind`` = ``measured``, ``sources`` = the JSON (name, the git sha it measured, its sha256).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from sparsemla import flags
from sparsemla import variant as kernel_variant
from sparsemla.ops.sim import calibrate_from_step as v4
from sparsemla.ops.sim import gpus
from sparsemla.ops.sim.calibrate_from_step import StepResultError, sha256_of
from sparsemla.ops.sim.calibration import (
    CALIBRATION_DIR,
    PROVISIONAL_PATH,
    ReferenceState,
    load_calibration,
    write_calibration,
)

app = typer.Typer(add_completion=False, help=__doc__)
RESULTS_DIR = v4.RESULTS_DIR
OUT_PATH = CALIBRATION_DIR / "deepseek-v3.2-h200.json"
FLAGS_ON = "sparsemla"  # the step_v32 JSON's flags-on state
REFERENCE = "flashmla"  # ... and its stock-sglang (Hopper) state
REQUIRED = ("op", "gpu", "git_sha", "date", "versions", "cap", "model", "states", "rows", "kernel_share")


def state_variant(flag_names: list[str]) -> str:
    """The variant a process with exactly these flags on reports (what the simulator selects its state by); the flags
    must give V3.2 its path (``SPARSEMLA_DSA_V32``)."""
    if flags.SPARSEMLA_DSA_V32.name not in flag_names:
        raise StepResultError(f"flags {flag_names} do not include {flags.SPARSEMLA_DSA_V32.name}: not a V3.2 state")
    switches = {kernel_variant.part_name(s) for s in kernel_variant.SWITCHES if s.name in flag_names}
    return kernel_variant.compose(switches)


def _check(doc: Any, source: str) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise StepResultError(f"{source}: expected a JSON object")
    for key in REQUIRED:
        if key not in doc:
            raise StepResultError(f"{source}: missing {key!r} (is this a step_v32 result?)")
    if doc["op"] != "step_v32":
        raise StepResultError(f"{source}: op is {doc['op']!r}, expected 'step_v32'")
    for key in ("torch", "triton", "cuda"):
        if key not in doc["versions"]:
            raise StepResultError(f"{source}: versions.{key} missing")
    if FLAGS_ON not in doc["states"] or not doc["states"][FLAGS_ON].get("measured"):
        raise StepResultError(f"{source}: state {FLAGS_ON!r} (flags on) was not measured")
    return doc


def _reference(doc: Mapping[str, Any]) -> dict[str, ReferenceState]:
    entry = doc["states"].get(REFERENCE)
    if entry is None:
        return {}
    description = entry.get("description") or "stock sglang's V3.2 decode"
    if entry.get("stands_in_for"):
        description += f" ({entry['stands_in_for']})"
    rows = {(r["state"], int(r["ctx"]), int(r["B"])): float(r["us"]) for r in doc["rows"]}
    step: dict[int, dict[int, float]] = {}
    speedup: dict[int, dict[int, float]] = {}
    for (state, c, b), us in sorted(rows.items()):
        if state != REFERENCE:
            continue
        step.setdefault(c, {})[b] = us
        if (FLAGS_ON, c, b) in rows:
            speedup.setdefault(c, {})[b] = us / rows[(FLAGS_ON, c, b)]
    if not step:
        reason = entry.get("reason") or "no step times in the result"
        return {REFERENCE: ReferenceState(description, False, reason=reason)}
    return {REFERENCE: ReferenceState(description, True, step, speedup)}


def calibration_args(doc: Any, source: str, sha256: str = "") -> dict[str, Any]:
    """Keyword arguments of :func:`write_calibration` from a step_v32 document (``sha256``: of its file)."""
    doc = _check(doc, source)
    on = doc["states"][FLAGS_ON]
    variant = state_variant(list(on.get("flags", [])))
    # the V4 adapter's per-state code reads a V4-shaped view: rows keyed by variant, kernel shares by variant
    view = {
        "variant_rows": [{**r, "variant": variant} for r in doc["rows"] if r["state"] == FLAGS_ON],
        "kernel_share": {variant: doc["kernel_share"].get(FLAGS_ON, {})},
    }
    state, raised, note = v4.state_from_step(view, variant)
    if state is None:
        raise StepResultError(f"{source}: state {FLAGS_ON!r}: {note}")
    labels = {**state.flags, kernel_variant.label_name(flags.SPARSEMLA_DSA_V32): "on"}
    description = f"{on.get('description', 'flags on')}; decode: {on.get('decode', 'not recorded')}"
    state = replace(state, flags=labels, description=description)
    refs = _reference(doc)
    model = doc["model"]
    notes = [
        f"Measured by benchmarks/step_v32.py ({model.get('deployment', '')}; {doc.get('method', '')}). State "
        f"{variant} = the result's {FLAGS_ON!r} state ({', '.join(on.get('flags', []))}): the variant those flags "
        f"report. step_us: median CUDA-graph replay of the whole {model['num_layers']}-layer decode step; kernel_us: "
        f"the profiled replay of the same point. Points whose step time was raised to the profiled kernel sum: "
        f"{raised}.",
        *([f"State {variant}: {note}."] if note else []),
        f"No baseline state: {doc.get('flags_off') or 'flags off has no V3.2 path'}.",
        "Prefill is not measured by the step benchmark: the shipped provisional calibration's prefill model "
        "(DeepSeek-V4-Flash, derived) is carried over, not a V3.2 measurement.",
    ]
    for name, ref in refs.items():
        if ref.measured:
            cells = "; ".join(
                f"ctx {c} B={b}: {us:.1f} us" + (f" (it / flags on = {ref.flags_on_speedup[c][b]:.3f}x)"
                                                 if b in ref.flags_on_speedup.get(c, {}) else "")
                for c, row in sorted(ref.step_us.items()) for b, us in sorted(row.items())
            )  # fmt: skip
            notes.append(f"Reference state {name} (measured in the same run, not a simulator state): step_us {cells}.")
        else:
            notes.append(f"Reference state {name} not measured: {ref.reason}.")
    versions = doc["versions"]
    pdoc = {**doc, **{k: versions[k] for k in ("torch", "triton", "cuda")}}
    gpu_key = gpus.gpu_key_for_name(str(doc["gpu"]))
    return {
        "model": v4.model_spec(doc),
        "prefill": load_calibration(PROVISIONAL_PATH).prefill,
        "provenance": v4.measured_provenance(
            pdoc,
            source,
            sha256,
            what="DeepSeek-V3.2 decode-step benchmark",
            method=f"benchmarks/step_v32.py on the GPU: {doc.get('method', '')}",
            notes=notes,
            described="DeepSeek-V3.2 decode-step benchmark result (results/bench/)",
        ),
        "states": {variant: state},
        "gpu": gpus.GPUS[gpu_key] if gpu_key is not None else None,
        "references": refs,
    }


def latest_result(directory: Path = RESULTS_DIR) -> Path | None:
    """The newest ``step_v32-*.json`` in ``directory`` by name (names end in the date), None when there is none."""
    return v4.latest_result(directory, "step_v32-*.json")


def calibrate(step_json: Path, out: Path = OUT_PATH) -> Path:
    """Read a step_v32 result and write the calibration; StepResultError / CalibrationError on bad input."""
    doc = v4.read_result(step_json)
    return write_calibration(out, **calibration_args(doc, str(step_json), sha256_of(step_json)))


def stale(committed: Path = OUT_PATH, results: Path = RESULTS_DIR) -> str | None:
    """None when ``committed`` equals what the adapter gives from the result it names (its ``provenance.sources``,
    looked up in ``results``), else what differs in words."""
    cal = load_calibration(committed)
    if len(cal.provenance.sources) != 1:
        return f"{committed}: expected one source, found {len(cal.provenance.sources)}"
    source = results / cal.provenance.sources[0].path
    if not source.is_file():
        return f"{committed}: its source {source} is absent"
    with tempfile.TemporaryDirectory(prefix="sparsemla-v32-") as tmp:
        rebuilt = json.loads(calibrate(source, Path(tmp) / committed.name).read_text())
    current = json.loads(committed.read_text())
    if rebuilt == current:
        return None
    keys = sorted(k for k in set(rebuilt) | set(current) if rebuilt.get(k) != current.get(k))
    return f"{committed.name} differs from what {source.name} gives (keys {', '.join(keys)})"


@app.command()
def main(
    step_json: Path = typer.Argument(None, help="step_v32 result (default: newest results/bench/step_v32-*.json)."),
    out: Path = typer.Option(OUT_PATH, help="Calibration file to write (or, with --check, to check)."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when the committed file is stale."),
) -> None:
    """Write (or check) the DeepSeek-V3.2 simulator calibration from a step_v32 benchmark result."""
    from sparsemla.console import fail
    from sparsemla.ops.sim.calibration import CalibrationError

    if check:
        try:
            problem = stale(out)
        except (StepResultError, CalibrationError) as exc:
            fail(str(exc), "run from the repository root, where results/bench/ holds the step_v32 result")
        if problem:
            print(f"stale: {problem}\nregenerate with `python -m sparsemla.ops.sim.calibrate_from_step_v32`")
            raise typer.Exit(1)
        print(f"current: {out}")
        return
    path = step_json or latest_result()
    if path is None:
        fail(f"no step_v32-*.json in {RESULTS_DIR}", "run `python -m benchmarks.step_v32` on a GPU first, or pass it")
    v4.write_and_report(calibrate, path, out, "pass the JSON written by `python -m benchmarks.step_v32`")


if __name__ == "__main__":
    app()
