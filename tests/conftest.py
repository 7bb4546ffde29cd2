"""Shared test setup: GPU tests skip cleanly on CPU; sglang's SM120 decode module runs its torch path on the CPU."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # sglang reads this once, when flash_mla_sm120 is first imported: its torch path is the only one a CPU can run.
    # Set it for the whole session before any test imports sglang (pytest's MonkeyPatch, not os.environ).
    mp = pytest.MonkeyPatch()
    mp.setenv("SGLANG_SM120_FLASHMLA_BACKEND", "torch")
    # Without a GPU the Triton kernels run on Triton's CPU interpreter; triton.jit reads this when a kernel is defined,
    # so it must be set before anything imports triton.
    if not _cuda_available():
        mp.setenv("TRITON_INTERPRET", "1")
    config._sparsemla_env = mp  # undone in pytest_unconfigure


def pytest_unconfigure(config: pytest.Config) -> None:
    mp = getattr(config, "_sparsemla_env", None)
    if mp is not None:
        mp.undo()
    aot = getattr(config, "_sparsemla_aot", None)
    if aot is not None:  # children test_aot.py never waited for (-k, -x, an interrupt) stop here; the folder goes
        for proc in aot.procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(aot.folder, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The AOT compile behind tests/test_aot.py (~9 minutes on two cores) starts now, in the background and at a lower
    # priority, so it overlaps the rest of the suite; see tests/aot_background.py.
    if any(item.path.name == "test_aot.py" for item in session.items):
        import aot_background

        folder = Path(tempfile.mkdtemp(prefix="sparsemla-aot-"))
        session.config._sparsemla_aot = aot_background.start(folder)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # test_aot.py last: its compile runs in the background meanwhile (pytest_collection_finish), so by then it is done
    items.sort(key=lambda item: item.path.name == "test_aot.py")  # stable: the rest keep their order
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every float ``torch.empty`` is filled with NaN (kernel outputs and workspaces), so an element a kernel never
    writes fails the comparison instead of inheriting freed memory that happens to hold the right answer."""
    import torch

    real = torch.empty

    def poisoned(*args, **kwargs):
        t = real(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", poisoned)
