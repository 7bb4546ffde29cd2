"""`sparsemla aot`: compile every kernel for GPUs this machine does not have and print what each needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from sparsemla import flags
from sparsemla.console import fail

app = typer.Typer()


@app.command("aot")
def aot_cmd(
    arch: list[str] = typer.Option(None, "--arch", help="Target (sm_80, sm_86, sm_89, sm_90, sm_100, sm_120); repeat."),
    case: list[str] = typer.Option(None, "--case", help="Only these cases (names as printed)."),
    json_path: Path = typer.Option(None, "--json", help="Write the records as JSON here."),
    markdown: Path = typer.Option(None, "--markdown", help="Write the docs/portability.md table here."),
    sass: Path = typer.Option(
        None, "--sass", help="Write each kernel's SASS into this folder: diff -r two of them to see what a change did."
    ),
) -> None:
    """Ahead-of-time compile of every Triton kernel at sglang's shapes: shared bytes, registers, spilled bytes per
    target; exit 1 when a kernel does not compile, exceeds the target's budget or spills more than 256 B."""
    from sparsemla.kernels import device as dev

    for a in arch or []:
        try:
            dev.target(a)
        except ValueError as exc:
            fail(str(exc), "pass --arch sm_80, sm_86, sm_89, sm_90, sm_100 or sm_120")
    cmd = [sys.executable, "-m", "sparsemla.kernels.aot"]
    for a in arch or []:
        cmd += ["--arch", a]
    for c in case or []:
        cmd += ["--case", c]
    if json_path:
        cmd += ["--json", str(json_path)]
    if markdown:
        cmd += ["--markdown", str(markdown)]
    if sass:
        cmd += ["--sass", str(sass)]
    # A child without TRITON_INTERPRET: the interpreter never compiles, and triton.jit reads it at import.
    raise typer.Exit(subprocess.run(cmd, env=flags.child_env({"TRITON_INTERPRET": None})).returncode)
