"""`sparsemla sim`: run the simulated sglang server in the foreground (FastAPI + uvicorn)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparsemla.console import console, fail
from sparsemla.ports import PORT_SERVER

if TYPE_CHECKING:
    from sparsemla.ops.sim.calibration import Calibration

app = typer.Typer()


@app.command("sim")
def sim(
    port: int = typer.Option(PORT_SERVER, "--port", help="HTTP port (sglang's default is 30000)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (0.0.0.0 to serve other machines)."),
    model: str = typer.Option(
        "deepseek-v4-flash",
        "--model",
        help="Model to simulate: deepseek-v4-flash (default) | deepseek-v3.2 (measured on the H200, flags on: "
        "SPARSEMLA_DSA_V32=1 SPARSEMLA_TRITON_INDEXER=1).",
    ),
    model_name: str = typer.Option(
        None, "--model-name", help="served_model_name label (default: the --model's Hugging Face name)."
    ),
    calibration: str = typer.Option(
        None, "--calibration", help="Calibration JSON (default: SPARSEMLA_SIM_CALIBRATION, else the --gpu file)."
    ),
    gpu: str = typer.Option(
        None,
        "--gpu",
        help="Run the shipped calibration of this GPU: h200 (measured) | rtx-pro-6000 | l40s | a100 (projected from "
        "the H200 runs). Default: SPARSEMLA_SIM_GPU (h200).",
    ),
    gpus: int = typer.Option(
        1,
        "--gpus",
        min=1,
        help="GPUs of the simulated server: 1 (the 1-GPU calibrations) or 8 with --tp 8 or "
        "--dp-attention (measured multi-rank calibration only: refused with exit 2 while none is measured).",
    ),
    tp: int = typer.Option(None, "--tp", min=1, help="TP size of a multi-GPU server (must equal --gpus)."),
    dp_attention: bool = typer.Option(False, "--dp-attention", help="DP attention + EP over the --gpus GPUs."),
    max_running_requests: int = typer.Option(256, "--max-running-requests", min=1, help="Max decode batch size."),
    max_total_tokens: int = typer.Option(1_048_576, "--max-total-tokens", min=1, help="KV pool size in tokens."),
    context_length: int = typer.Option(None, "--context-length", min=2, help="Default: the calibration's."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    openapi: str = typer.Option(None, "--openapi", help="Write the OpenAPI schema (JSON) to this path and exit."),
    api_key: str = typer.Option(
        None,
        "--api-key",
        help="As sglang's: require `Authorization: Bearer <key>` (401 otherwise) on every route "
        "but /health*, /ready*, /metrics.",
    ),  # fmt: skip
) -> None:
    """Simulated sglang server: sglang's HTTP API and metrics, step times from the kernel calibration."""
    import uvicorn

    from sparsemla import flags
    from sparsemla.ops.sim import models
    from sparsemla.ops.sim.calibration import CalibrationError, load_calibration
    from sparsemla.ops.sim.server import SimConfig, create_app

    if api_key is not None and not api_key.strip():
        fail("--api-key must not be empty", "give the key clients send as `Authorization: Bearer <key>`")
    try:
        served = models.get(model)
    except models.ModelError as exc:
        fail(str(exc), exc.hint)
    model_name = model_name or served.name
    if gpus > 1 or tp not in (None, 1) or dp_attention:  # -- multi-GPU: a measured deployment file or nothing --
        if served.files is not None:
            fail(f"--model {served.key}: no multi-GPU calibration is measured (only the 1-GPU step)",
                 "drop --gpus/--tp/--dp-attention")  # fmt: skip
        calibration = str(_deployment_file(gpus, tp, dp_attention, calibration, gpu))
        gpu = None
    try:
        flags.validate_all()
        if served.files is not None and calibration is None:  # the model's own file of the GPU
            calibration = models.calibration_path(served, gpu)
            gpu = None if calibration is not None else gpu
        cal = load_calibration(calibration, gpu)
        if (mismatch := models.problem(served, cal)) is not None:
            raise mismatch
        config = SimConfig(model_name, max_running_requests, max_total_tokens, context_length, api_key=api_key)
        application = create_app(cal, config)
    except models.ModelError as exc:
        fail(str(exc), exc.hint)
    except (CalibrationError, flags.FlagError) as exc:
        fail(str(exc), "check --calibration / --gpu, SPARSEMLA_SIM_CALIBRATION / SPARSEMLA_SIM_GPU (`sparsemla flags`)")
    if openapi:
        import json

        Path(openapi).write_text(json.dumps(application.openapi(), indent=1) + "\n")
        console.print(f"wrote {openapi}")
        return
    prov = cal.provenance
    label = {"projected": "[bold yellow]PROJECTED[/] ", "derived": "[bold yellow]PROVISIONAL[/] "}.get(cal.kind, "")
    console.print(
        f"sim: {model_name} variant=[bold]{application.state.variant}[/] on http://{host}:{port}  "
        f"calibration {label}{cal.path} ({prov.gpu}, {prov.date}, {prov.git_sha[:12]})"
    )
    if cal.baseline is not None:
        console.print(f"  flags off on this GPU = {cal.baseline.label}")
    for line in _reference_lines(cal):
        console.print(f"  {line}", markup=False)
    if cal.deployment is not None:
        console.print(f"  server = {cal.label()}")
    uvicorn.run(application, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=120,
                backlog=4096)  # fmt: skip


def _reference_lines(cal: Calibration) -> list[str]:
    """One line per reference state of the calibration (sglang's fast path: compared with, never served): flags on's
    speed-up over it at the largest measured batch, or why it was not measured."""
    lines = []
    for name, ref in cal.references.items():
        if not ref.measured:
            lines.append(f"sglang's fast path ({name}, not served): not measured: {ref.reason}")
            continue
        batch = max((b for row in ref.flags_on_speedup.values() for b in row), default=None)
        cells = ", ".join(f"{x:.2f}x ({c // 1024}k context)" for c, x in ref.speedups_at(batch)) if batch else ""
        lines.append(
            f"vs sglang's fast path ({name}, measured in the decode-step benchmark, not served): "
            + (f"its step time / flags on's at B={batch}: {cells}" if cells else "flags on not measured beside it")
        )
    return lines


def _deployment_file(gpus: int, tp: int | None, dp_attention: bool, calibration: str | None, gpu: str | None) -> Path:
    """The measured multi-GPU calibration of ``--gpus N --tp N`` / ``--dp-attention``; exit 2 with what to run when
    it is not measured (the 1-GPU calibration is never passed off as an N-GPU server)."""
    from sparsemla.ops.sim.calibration import CalibrationAbsent, deployment_path

    if calibration is not None:
        fail("--calibration and --gpus/--tp/--dp-attention both given", "give one: the file, or the deployment")
    if gpus < 2:
        fail(f"--tp {tp} / --dp-attention need --gpus > 1", "e.g. --gpus 8 --tp 8, or --gpus 8 --dp-attention")
    if tp is not None and tp != gpus:
        fail(f"--tp {tp} with --gpus {gpus}: sglang's --tp is the server's GPU count in both deployments",
             f"--gpus {gpus} --tp {gpus} (or --dp-attention)")  # fmt: skip
    try:
        return deployment_path(gpu or "h200", gpus, "dp-attention" if dp_attention else "tp")
    except CalibrationAbsent as exc:
        fail(str(exc), exc.hint)
