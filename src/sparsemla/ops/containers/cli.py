"""``python -m sparsemla.ops.containers check | standins``: the container checks `make test-containers` runs, for a
user's machine too (``--engine docker --registry``: Docker and the real base images)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import typer

from sparsemla.console import fail
from sparsemla.ops.containers import compose_check, image_check, standins
from sparsemla.ops.containers.engine import ENGINES, ContainersError, Engine, exclusive, repo_root
from sparsemla.procs import sigterm_as_interrupt

app = typer.Typer(
    help="Build and run the sparsemla images for real (podman or Docker).", no_args_is_help=True, add_completion=False
)

_ENGINE = typer.Option("podman", "--engine", help=f"{' | '.join(ENGINES)}.")
_REGISTRY = typer.Option(
    False, "--registry/--standins", help="Base images from their registries, or local stand-ins (podman, Debian, root)."
)


def log(message: str) -> None:
    print(f"[containers] {message}", flush=True)


def _engine(name: str) -> Engine:
    try:
        engine = Engine(name, repo_root(Path.cwd()))
        engine.require()
    except ContainersError as exc:
        fail(str(exc))
    return engine


@app.command("standins")
def standins_cmd(engine: str = _ENGINE) -> None:
    """Build (or reuse) the stand-in base images and print their tags."""
    eng = _engine(engine)
    try:
        with exclusive(log):
            made = standins.ensure_standins(eng, log)
    except ContainersError as exc:
        fail(str(exc))
    print(f"python     {made.python}\nprometheus {made.prometheus}")


@app.command("check")
def check_cmd(
    engine: str = _ENGINE,
    registry: bool = _REGISTRY,
    work_dir: Path = typer.Option(
        None, "--work-dir", help="Load-test results and the compose env file (default: a temp dir)."
    ),
) -> None:
    """The image check, then the compose check (see sparsemla.ops.containers); exit 1 on the first failure."""
    eng = _engine(engine)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sparsemla-containers-") as tmp:
        work = work_dir or Path(tmp)
        try:
            # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so every check's cleanup runs.
            with sigterm_as_interrupt(), exclusive(log):
                images = standins.prepare_images(eng, registry, log)
                image_check.check_image(eng, images.ops, work / "image", log)
                stack = compose_check.ComposeStack(eng, images.ops_version, images.prometheus, work / "compose")
                compose_check.check_compose(stack, log)
        except ContainersError as exc:
            typer.echo(f"[containers] FAILED: {exc}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("[containers] stopped by a signal (the checks cleaned up after themselves)", err=True)
            raise typer.Exit(130) from None
    log(f"passed in {time.monotonic() - start:.0f} s")


def main() -> None:
    app()
