"""The `sparsemla` command line: one typer app whose commands live beside the code they drive.

Each area keeps a light ``cli.py`` with its own ``typer.Typer`` (heavy imports happen inside the commands); this module
merges their commands into one flat namespace (`sparsemla sim`, `sparsemla loadtest`, ...). The Makefile only calls
these commands.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

from sparsemla import flags
from sparsemla.console import UsageError, console, err_console, fail

# Areas whose commands are merged into the top-level app, in help order. Every module named here exists in the
# checkout; an area is skipped only when its package is not installed (the GPU image ships just kernels, plugin, flags
# and this module: there `sparsemla.ops`, `sparsemla.loadtest` and `sparsemla.dashboards` are absent).
COMMAND_MODULES = (
    "sparsemla.ops.sim.cli",
    "sparsemla.ops.sim.calibrate_cli",
    "sparsemla.loadtest.cli",
    "sparsemla.ops.cli",
    "sparsemla.dashboards.cli",
    "sparsemla.kernels.cli",
    "sparsemla.ops.demo",
)

app = typer.Typer(
    name="sparsemla",
    help="Triton sparse-MLA kernels for sglang, and the loop that proves every flag flip.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("flags")
def flags_cmd(
    markdown: bool = typer.Option(False, "--markdown", help="Print docs/flags.md instead of the current values."),
    check: bool = typer.Option(False, "--check", help="Exit 2 if any flag in the environment has a bad value."),
) -> None:
    """Show every flag, its current value and where it came from."""
    if markdown:
        print(flags.markdown_table(), end="")
        return
    try:
        flags.validate_all()
    except flags.FlagError as exc:
        fail(str(exc), "fix or unset the variable; `sparsemla flags --markdown` lists the allowed values")
    if check:
        return
    for flag in flags.REGISTRY.values():
        source = flag.source() or "default"
        console.print(f"{flag.name:28} = {flag.as_label()!s:10} [dim]({source}; {flag.group})[/]")


def _installed(package: str) -> bool:
    """Whether the top-level area ``package`` (e.g. ``sparsemla.ops``) is installed at all."""
    return importlib.util.find_spec(package) is not None


def _merge(module_name: str) -> None:
    """Add the commands of ``module_name``'s ``app``; skip it only when its area's package is not installed (any
    other import error, including a missing module inside an installed area, raises)."""
    area = ".".join(module_name.split(".")[:2])  # sparsemla.ops.sim.cli -> sparsemla.ops
    if not _installed(area):
        return
    module = importlib.import_module(module_name)
    app.registered_commands.extend(module.app.registered_commands)


for _name in COMMAND_MODULES:
    _merge(_name)


def main() -> None:
    """Entry point: run the app; user mistakes (UsageError, FlagError) exit 2 with a message, not a traceback."""
    try:
        app()
    except (UsageError, flags.FlagError) as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
