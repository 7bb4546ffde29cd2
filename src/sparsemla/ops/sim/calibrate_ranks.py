"""Simulator calibration of a multi-GPU server from a multi-rank step result: ``python -m
sparsemla.ops.sim.calibrate_ranks results/bench/ranks8-<deployment>-step-<gpu>-<date>.json``.

Reads the JSON of ``python -m benchmarks.step --ranks N`` (``op`` ``step_ranks``) and writes the file
``sparsemla sim --gpus N --tp N`` / ``--dp-attention`` selects (:data:`sparsemla.ops.sim.calibration.DEPLOYMENT_FILES`).
Mapping, per state over the complete (batch x context) grid exactly as :mod:`sparsemla.ops.sim.calibrate_from_step`:
``step_us`` = the point's step (median over replays of the slowest rank's replay), ``kernel_us`` = the slowest rank's
profiled kernels (NCCL kernels under ``communication``). The batch axis is the server's running requests: B for TP
(every rank computes the same batch), N x B for DP attention (each DP rank its own B); ``deployment`` records which.
A gloo (CPU) result is a harness test, not a measurement of the server: it is refused unless ``--out`` names another
file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from sparsemla.ops.sim import calibrate_from_step as single
from sparsemla.ops.sim import gpus
from sparsemla.ops.sim.calibration import (
    DEPLOYMENT_FILES,
    PROVISIONAL_PATH,
    CalibrationError,
    Deployment,
    load_calibration,
    write_calibration,
)
from sparsemla.variant import VARIANTS

app = typer.Typer(add_completion=False, help=__doc__)
StepResultError = single.StepResultError


def server_view(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The rows and kernel shares re-keyed by the server's batch (what the simulator's engine runs)."""
    factor = int(doc["ranks"]) if doc["deployment"] == "dp-attention" else 1
    rows = [r | {"B": int(r["B"]) * factor} for r in doc["variant_rows"]]
    shares = {
        v: {ctx: {str(int(b) * factor): e for b, e in by_b.items()} for ctx, by_b in by_ctx.items()}
        for v, by_ctx in doc.get("kernel_share", {}).items()
    }
    return {"variant_rows": rows, "kernel_share": shares}


def calibration_args(doc: Mapping[str, Any], source: str, sha256: str = "") -> dict[str, Any]:
    """Keyword arguments of :func:`write_calibration` from a multi-rank step document."""
    for key in ("op", "ranks", "deployment", "backend", "gpu", "git_sha", "date", "torch", "triton", "cuda", "cap",
                "model", "variant_rows", "nccl_env"):  # fmt: skip
        if key not in doc:
            raise StepResultError(f"{source}: missing {key!r} (is this a multi-rank step result?)")
    if doc["op"] != "step_ranks":
        raise StepResultError(
            f"{source}: op is {doc['op']!r}, expected 'step_ranks' (1-GPU results: calibrate_from_step)"
        )
    if doc["deployment"] not in ("tp", "dp-attention"):
        raise StepResultError(f"{source}: unknown deployment {doc['deployment']!r}")
    if doc["nccl_env"].get("NCCL_NVLS_ENABLE") != "0":
        raise StepResultError(f"{source}: measured without NCCL_NVLS_ENABLE=0 (multicast must be off)")
    view = server_view(doc)
    states, notes = {}, []
    for variant in VARIANTS:
        state, raised, reason = single.state_from_step(view, variant)
        if state is None:
            if reason != "not measured":
                notes.append(f"state {variant} left out: {reason}.")
            continue
        notes.append(
            f"state {variant}: {raised} points raised to their kernel sum." + (f" {reason}." if reason else "")
        )
        states[variant] = state
    if not states:
        raise StepResultError(f"{source}: no flag state has a complete batch grid of step times and kernel shares")
    n, dp = int(doc["ranks"]), doc["deployment"] == "dp-attention"
    model = doc["model"]
    gpu_key = gpus.gpu_key_for_name(str(doc["gpu"]))
    axis = "N x B per rank" if dp else "B, shared by the ranks"
    notes.insert(
        0,
        f"Measured by benchmarks/step_ranks.py on {n} ranks ({doc['backend']}): {model['deployment']}. Batch axis = "
        f"the server's running requests ({axis}). Prefill is not measured: carried over from the provisional 1-GPU "
        "calibration (derived).",
    )
    return {
        "model": single.model_spec(doc),
        "prefill": load_calibration(PROVISIONAL_PATH).prefill,
        "provenance": single.measured_provenance(
            doc,
            source,
            sha256,
            what="multi-rank step benchmark",
            method=f"benchmarks/step_ranks.py: {doc.get('method', '')}; NCCL {doc.get('nccl_version')}",
            notes=notes,
            described="multi-rank decode-step result (results/bench/)",
        ),
        "states": states,
        "gpu": gpus.GPUS[gpu_key] if gpu_key is not None else None,
        "baseline": gpus.BASELINES[gpu_key] if gpu_key is not None else None,
        "deployment": Deployment(gpus=n, tp=n, dp_attention=dp, ep=n if dp else 1, batch_axis="server"),
    }


def default_out(doc: Mapping[str, Any]) -> Path:
    """The shipped file of the result's (GPU, ranks, deployment); StepResultError when the simulator has none."""
    gpu_key = gpus.gpu_key_for_name(str(doc["gpu"]))
    path = DEPLOYMENT_FILES.get((gpu_key or "", int(doc["ranks"]), str(doc["deployment"])))
    if path is None or doc["backend"] != "nccl":
        raise StepResultError(
            f"the simulator ships no calibration for {doc['ranks']}x {doc['gpu']} {doc['deployment']} "
            f"({doc['backend']}): pass --out (a gloo/CPU run is a harness test, not a measurement)"
        )
    return path


def calibrate(step_json: Path, out: Path | None = None) -> Path:
    """Read a multi-rank result and write its calibration (``out`` default: :func:`default_out`)."""
    try:
        doc = json.loads(step_json.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StepResultError(f"cannot read {step_json}: {exc}") from None
    if not isinstance(doc, dict):
        raise StepResultError(f"{step_json}: expected a JSON object")
    args = calibration_args(doc, str(step_json), single.sha256_of(step_json))
    return write_calibration(out or default_out(doc), **args)


@app.command()
def main(
    step_json: Path = typer.Argument(..., help="results/bench/ranks<N>-<deployment>-step-<gpu>-<date>.json"),
    out: Path = typer.Option(None, help="Calibration to write (default: the file `sparsemla sim --gpus N` reads)."),
) -> None:
    """Write the multi-GPU simulator calibration from a multi-rank step result."""
    from sparsemla.console import fail

    try:
        written = calibrate(step_json, out)
    except (StepResultError, CalibrationError) as exc:
        fail(str(exc), "pass the JSON written by `python -m benchmarks.step --ranks N`")
    cal = load_calibration(written)
    print(f"wrote {written}: {cal.label()}; states {', '.join(cal.states)}")


if __name__ == "__main__":
    app()
