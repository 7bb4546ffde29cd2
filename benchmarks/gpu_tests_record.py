"""Summarise the GPU test runs of ``benchmarks/gpu-tests.sh`` (JUnit XML per code path) into one JSON record for
``results/gpu-tests/``: ``python -m benchmarks.gpu_tests_record DIR --sha SHA --gpu NAME --torch V --triton V``.

The record says how the tests were run (``--command``: gpu-tests.sh passes its arguments, so a run of some files
says which) and, per code path, how many tests ran, passed, failed, errored and were skipped (with the skip reasons
counted), how many of each test module, the wall time, and the ids of every failing test; nothing is typed in by
hand."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import typer

PATHS = ("native", "sm89")


def _skip_reason(skip: ET.Element) -> str:
    """A skip's reason; a module skipped at collection says why in its text ("Skipped: could not import ...")."""
    message = skip.get("message") or ""
    if message == "collection skipped" and "Skipped:" in (skip.text or ""):
        reason = skip.text.split("Skipped:", 1)[1].strip().removesuffix(")")  # the repr of (path, line, "Skipped: ...")
        message = "collection: " + (reason[:-1] if reason[-1:] in "'\"" else reason)
    return message[:160]


def summarise(xml_path: Path) -> dict:
    """One code path's JUnit XML -> counts, skip reasons and failing ids (``module::test[param]``)."""
    suite = ET.parse(xml_path).getroot().find("testsuite")
    if suite is None:
        raise ValueError(f"{xml_path}: no <testsuite>")
    failed, reasons, modules = [], Counter(), Counter()
    for case in suite.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        modules[case.get("classname") or case.get("name")] += 1  # a module skipped at collection: its name
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        skip = case.find("skipped")
        if skip is not None:
            reasons[_skip_reason(skip)] += 1
    tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
    failures, errors = int(suite.get("failures")), int(suite.get("errors"))
    return {
        "tests": tests,
        "passed": tests - skipped - failures - errors,
        "failures": failures,
        "errors": errors,
        "skipped": skipped,
        "skip_reasons": dict(reasons.most_common()),
        "seconds": float(suite.get("time")),
        "failed": failed,
        "modules": dict(sorted(modules.items())),
    }


app = typer.Typer(add_completion=False)


@app.command()
def main(
    run_dir: Path = typer.Argument(..., help="folder holding gpu-native.xml / gpu-sm89.xml"),
    sha: str = typer.Option(..., help="git sha of the tree that ran"),
    gpu: str = typer.Option(...),
    torch_version: str = typer.Option(..., "--torch"),
    triton_version: str = typer.Option(..., "--triton"),
    out: Path = typer.Option(None, help="JSON to write (default: stdout)"),
    command: str = typer.Option(
        "bash benchmarks/gpu-tests.sh both", help="how the tests were run (gpu-tests.sh passes its own arguments)"
    ),
) -> None:
    paths = {p: summarise(run_dir / f"gpu-{p}.xml") for p in PATHS if (run_dir / f"gpu-{p}.xml").exists()}
    if not paths:
        typer.echo(f"no gpu-native.xml or gpu-sm89.xml under {run_dir}", err=True)
        raise typer.Exit(2)
    stamp = ET.parse(next(iter(run_dir.glob("gpu-*.xml")))).getroot().find("testsuite").get("timestamp", "")
    record = {
        "gpu": gpu,
        "torch": torch_version,
        "triton": triton_version,
        "date": stamp[:10],
        "git_sha": sha,
        "command": f"{command}  (pytest -m gpu -n 12, native then TRITON_OVERRIDE_ARCH=sm89)",
        "paths": paths,
    }
    text = json.dumps(record, indent=1) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)


if __name__ == "__main__":
    app()
