"""The models `sparsemla sim --model` serves, and which calibration and flags each needs.

* ``deepseek-v4-flash`` (the default): the calibrations of :data:`sparsemla.ops.sim.calibration.GPU_FILES` and the
  multi-GPU deployment files; its states are the flag variants.
* ``deepseek-v3.2``: ``calibration/deepseek-v3.2-h200.json`` (measured on one H200 by ``benchmarks/step_v32.py``,
  written by :mod:`sparsemla.ops.sim.calibrate_from_step_v32`). Its one state is flags on (``SPARSEMLA_DSA_V32=1
  SPARSEMLA_TRITON_INDEXER=1``, variant ``triton_indexer``); stock sglang (FlashMLA) is a reference, never served.

:func:`calibration_path` picks a model's file, :func:`problem` says why a loaded calibration cannot serve the model
with the current flags (``sparsemla sim`` then exits 2 with the message and what to fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparsemla import flags
from sparsemla import variant as kernel_variant
from sparsemla.ops.sim.calibration import CALIBRATION_DIR, Calibration


@dataclass(frozen=True)
class SimModel:
    """A model the simulator serves: ``key`` as ``--model`` takes it, ``name`` its served_model_name by default (and
    the ``model.name`` of its calibrations), ``files`` its 1-GPU calibration per GPU key (None: the V4 files of
    :func:`sparsemla.ops.sim.calibration.resolve_path`, the multi-GPU ones included)."""

    key: str
    name: str
    files: dict[str, Path] | None = None


V4_FLASH = SimModel("deepseek-v4-flash", "deepseek-ai/DeepSeek-V4-Flash")
V32 = SimModel("deepseek-v3.2", "deepseek-ai/DeepSeek-V3.2", {"h200": CALIBRATION_DIR / "deepseek-v3.2-h200.json"})
MODELS: dict[str, SimModel] = {m.key: m for m in (V4_FLASH, V32)}
DEFAULT = V4_FLASH.key
V32_FLAGS = "SPARSEMLA_DSA_V32=1 SPARSEMLA_TRITON_INDEXER=1"


class ModelError(ValueError):
    """A model, calibration and flags that do not go together; ``hint`` says what to change."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def get(key: str) -> SimModel:
    """The model of a ``--model`` value (case-insensitive); ModelError naming the valid choices otherwise."""
    model = MODELS.get(key.strip().lower())
    if model is None:
        raise ModelError(f"unknown --model {key!r}", f"valid choices: {', '.join(MODELS)} (default {DEFAULT})")
    return model


def calibration_path(model: SimModel, gpu: str | None) -> str | None:
    """The calibration file of a model with its own ``files`` when no ``--calibration`` is given: that of ``--gpu``,
    else of ``SPARSEMLA_SIM_GPU`` (default h200); None when ``SPARSEMLA_SIM_CALIBRATION`` is set and no GPU given
    (the usual resolution then applies). ModelError for a GPU the model has no file for."""
    if model.files is None:
        return None
    if gpu is None and flags.SPARSEMLA_SIM_CALIBRATION.get():
        return None
    key = (gpu or flags.SPARSEMLA_SIM_GPU.get()).strip().lower()
    if key not in model.files:
        raise ModelError(
            f"no {model.name} calibration for GPU {key!r}: only {', '.join(model.files)} was measured",
            f"--gpu {' | '.join(model.files)} (or --calibration FILE), or drop --model for the DeepSeek-V4 GPUs",
        )
    return str(model.files[key])


def problem(model: SimModel, cal: Calibration) -> ModelError | None:
    """Why ``cal`` cannot serve ``model`` under the current flags, or None: a file of another known model, or (V3.2)
    flags that select no measured V3.2 state."""
    other = next((m for m in MODELS.values() if m.name == cal.model.name and m is not model), None)
    if other is not None or (model.files is not None and cal.model.name != model.name):
        return ModelError(
            f"calibration {cal.path} describes {cal.model.name}, not {model.name} (--model {model.key})",
            f"--model {other.key}" if other else f"a calibration whose model.name is {model.name}",
        )
    if model is not V32:
        return None
    variant = kernel_variant.current()
    if flags.SPARSEMLA_DSA_V32.get() and not flags.SPARSEMLA_DISABLE.get() and variant in cal.states:
        return None
    set_now = ", ".join(f"{f.name}={f.as_label()}" for f in flags.kernel_flags() if f.is_set()) or "no kernel flags"
    return ModelError(
        f"--model {model.key}: the flags ({set_now}; variant {variant}) select no measured DeepSeek-V3.2 state; "
        f"{cal.path} has {', '.join(cal.states)} (flags on) only. Flags off is stock sglang's FlashMLA on Hopper, "
        f"a reference ({', '.join(cal.references) or 'none'}), never served; SPARSEMLA_MMA_DECODE switches the "
        "DeepSeek-V4 decode and was not measured with V3.2",
        f"run with {V32_FLAGS} (and SPARSEMLA_MMA_DECODE, SPARSEMLA_DISABLE, SPARSEMLA_FORCE_REFERENCE unset)",
    )
