"""`sparsemla calibrate`: write (or check) the PROJECTED calibrations of the GPUs that were not measured.

Its own typer app (not ``ops/sim/cli.py``'s): that module's single command runs as ``app()`` without a name.
"""

from __future__ import annotations

import typer

from sparsemla.console import console, fail

app = typer.Typer()


@app.command("calibrate")
def calibrate_cmd(
    project: str = typer.Option(
        "all", "--project", help="GPU to project from the measured H200 files: rtx-pro-6000 | l40s | a100 | all."
    ),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when a committed file is stale."),
) -> None:
    """Project the measured H200 decode step onto other GPUs -> src/sparsemla/ops/sim/calibration/<gpu>.json."""
    from rich.table import Table

    from sparsemla.ops.sim.calibration import CalibrationError, load_calibration
    from sparsemla.ops.sim.project import PROJECTABLE, Inputs, ProjectionError, stale, write_projected

    targets = PROJECTABLE if project == "all" else (project,)
    if any(t not in PROJECTABLE for t in targets):
        fail(f"cannot project {project!r}", f"pass one of {', '.join(PROJECTABLE)} or all (h200 is measured)")
    try:
        inputs = Inputs.default()
        if check:
            problems = [p for p in (stale(t, inputs) for t in targets) if p]
            for problem in problems:
                console.print(f"[bold red]stale:[/] {problem}")
            if problems:
                console.print("regenerate with `sparsemla calibrate --project all` (from the repository root)")
                raise typer.Exit(1)
            console.print(f"current: {', '.join(targets)}")
            return
        written = [write_projected(t, inputs) for t in targets]
    except (ProjectionError, CalibrationError) as exc:
        fail(str(exc), "run from the repository root, where results/bench/ holds the measured H200 runs")
    table = Table(title="projected decode-step time, ms (context 4096)")
    for col in ("GPU", "state", "B=1", "B=16", "B=64"):
        table.add_column(col, justify="left" if col in ("GPU", "state") else "right")
    for path in written:
        cal = load_calibration(path)
        for name, state in cal.states.items():
            cells = [f"{state.step_seconds(b, 4096) * 1e3:.1f}" for b in (1, 16, 64)]
            table.add_row(cal.gpu.name if cal.gpu else str(path), name, *cells)
    console.print(table)
    for path in written:
        console.print(f"wrote {path} [bold yellow](PROJECTED)[/]")
