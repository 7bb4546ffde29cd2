"""Code paths of one benchmark run: ``native`` (the GPU's own code: wgmma on Hopper, mma.sync tiles at few
programs) and ``smNN`` (``TRITON_OVERRIDE_ARCH=smNN``: Triton emits that architecture's code, mma.sync for sm89, and
the launchers pick that target's configurations). Each path runs in its own process: the variable is read when Triton
compiles, and one process's kernel cache must not mix the two paths. The parent merges the rows into one JSON, so both
paths share a run."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from sparsemla import flags


def parse(paths: str) -> list[str]:
    out = [p.strip() for p in paths.split(",") if p.strip()]
    bad = [p for p in out if p != "native" and not (p.startswith("sm") and p[2:].isdigit())]
    if bad or not out:
        raise ValueError(f"unknown code path(s) {bad or paths!r}: use native and/or smNN (e.g. sm89)")
    return out


def provider(name: str, path: str) -> str:
    """``sparsemla_graph`` in the sm89 path is ``sparsemla_sm89path_graph``; other providers keep their names."""
    if path == "native" or not name.startswith("sparsemla"):
        return name
    return name.replace("sparsemla", f"sparsemla_{path}path", 1)


def child_argv(module: str, argv: list[str], path: str, out: Path) -> list[str]:
    """``python -m module argv --paths path --child-out out``, with the parent's own --paths / --child-out dropped."""
    cleaned, skip = [], False
    for a in argv:  # drop the parent's own --paths / --child-out
        if skip:
            skip = False
            continue
        if a in ("--paths", "--child-out"):
            skip = True
            continue
        if a.startswith(("--paths=", "--child-out=")):
            continue
        cleaned.append(a)
    return [sys.executable, "-m", module, *cleaned, "--paths", path, "--child-out", str(out)]


def run_child(module: str, argv: list[str], path: str, out: Path) -> dict:
    """Run ``python -m module argv --paths path --child-out out`` with the path's environment; its JSON."""
    env = flags.child_env({"TRITON_OVERRIDE_ARCH": None if path == "native" else path})
    subprocess.run(child_argv(module, argv, path, out), env=env, check=True)
    return json.loads(out.read_text())


def run_children(module: str, argv: list[str], paths: list[str]) -> tuple[list[dict], list[dict]]:
    """:func:`run_child` for each path in turn: every child's rows, and its checks tagged with their ``code_path``."""
    rows: list[dict] = []
    checks: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            doc = run_child(module, argv, path, Path(tmp) / f"{path}.json")
            rows += doc["rows"]
            checks += [{**x, "code_path": path} for x in doc["checks"]]
    return rows, checks
