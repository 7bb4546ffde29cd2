"""Result files every area writes: atomic JSON documents and the commit they belong to."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, indent: int = 2, default: Callable[[Any], Any] | None = None) -> Path:
    """Write JSON so that readers never see a half-written file (temp file + fsync + rename); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as fh:
        json.dump(data, fh, indent=indent, default=default)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    return path


def git_sha(short: int | None = None) -> str | None:
    """The commit of this checkout (``short`` hex digits, or all), None outside a git checkout."""
    args = ["git", "rev-parse", f"--short={short}" if short else "--verify", "HEAD"]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
