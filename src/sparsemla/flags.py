"""The one module of sparsemla that reads the process environment.

Every environment variable the project honours is declared here once, typed, with a default, the allowed values and a
help line. Callers read ``flags.SPARSEMLA_MMA_DECODE.get()``; tests use
``with flags.SPARSEMLA_MMA_DECODE.override(True):``.
A bad value raises :class:`FlagError` naming the variable and what it accepts. Truth-testing a flag object
(``if flags.X:``) raises, because it is always a bug (the object is truthy whatever the value).

``docs/flags.md`` is generated from :data:`REGISTRY` (``sparsemla flags --markdown``) and a test fails when it is stale.
Subprocesses that need flags set get their environment from :func:`child_env`, so nothing else touches ``os.environ``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class FlagError(ValueError):
    """A flag has a value it cannot take. The message names the flag and the allowed values."""


@dataclass
class Flag(Generic[T]):
    """One environment variable: name, parser, default, allowed values (for docs and errors) and help."""

    name: str
    default: T
    help: str
    allowed: str
    parse: Callable[[str], T]
    group: str = "kernels"
    aliases: tuple[str, ...] = ()
    _local: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    def raw(self) -> str | None:
        """The raw string from the environment (the canonical name wins over aliases), or None when unset."""
        for key in (self.name, *self.aliases):
            value = os.environ.get(key)
            if value is not None:
                return value
        return None

    def source(self) -> str | None:
        """Which variable set the value (the name or an alias), or None when the default applies."""
        for key in (self.name, *self.aliases):
            if key in os.environ:
                return key
        return None

    def is_set(self) -> bool:
        """True when the user set the variable explicitly (or an override is active)."""
        return bool(getattr(self._local, "stack", None)) or self.raw() is not None

    def get(self) -> T:
        """The current value: innermost override, else the parsed environment value, else the default."""
        stack = getattr(self._local, "stack", None)
        if stack:
            return stack[-1]
        raw = self.raw()
        if raw is None:
            return self.default
        try:
            return self.parse(raw.strip())
        except (ValueError, TypeError) as exc:
            raise FlagError(f"{self.name}={raw!r} is not valid: {exc}. Allowed: {self.allowed}.") from None

    @contextlib.contextmanager
    def override(self, value: T) -> Iterator[None]:
        """Temporarily force the value in this thread (tests); the value is validated like an environment string."""
        if isinstance(value, str):
            value = self.parse(value)
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(value)
        try:
            yield
        finally:
            stack.pop()

    def __bool__(self) -> bool:
        raise TypeError(f"use {self.name}.get(), not the flag object, in a boolean context")

    def as_label(self) -> str:
        """The value as a short string for metrics labels and logs."""
        value = self.get()
        if isinstance(value, bool):
            return "on" if value else "off"
        return "" if value is None else str(value)


def is_true(raw: str) -> bool:
    """Whether a boolean flag value means on (``1``/``true``/``yes``/``on``, any case); the one truthy set."""
    return raw.strip().lower() in _TRUE


def _parse_bool(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected a boolean")


def _parse_split_k(raw: str) -> str | int:
    if raw.lower() in ("", "auto"):
        return "auto"
    value = int(raw)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _parse_positive_float(raw: str) -> float:
    value = float(raw)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _parse_str(raw: str) -> str:
    return raw


def _parse_optional_str(raw: str) -> str | None:
    return raw or None


REGISTRY: dict[str, Flag[Any]] = {}


def _register(flag: Flag[T]) -> Flag[T]:
    if flag.name in REGISTRY:
        raise RuntimeError(f"flag {flag.name} declared twice")
    REGISTRY[flag.name] = flag
    return flag


def bool_flag(name: str, default: bool, help: str, group: str = "kernels", aliases: tuple[str, ...] = ()) -> Flag[bool]:
    return _register(Flag(name, default, help, "1/0, true/false, yes/no, on/off", _parse_bool, group, aliases))


def str_flag(name: str, default: str | None, help: str, group: str, allowed: str = "any string") -> Flag[Any]:
    parse = _parse_optional_str if default is None else _parse_str
    return _register(Flag(name, default, help, allowed, parse, group))


def choice_flag(name: str, default: str, choices: tuple[str, ...], help: str, group: str = "kernels") -> Flag[str]:
    def parse(raw: str) -> str:
        low = raw.lower()
        if low not in choices:
            raise ValueError(f"unknown value {raw!r}")
        return low

    return _register(Flag(name, default, help, " | ".join(choices), parse, group))


# --------------------------------------------------------------------------------------------------------------------
# Kernel switches (read by sparsemla.kernels and by the sglang plugin in every sglang process)
# --------------------------------------------------------------------------------------------------------------------
SPARSEMLA_DISABLE = bool_flag(
    "SPARSEMLA_DISABLE", False, "Master off switch: every sglang call runs sglang's own code, whatever else is set."
)
SPARSEMLA_MMA_DECODE = bool_flag(
    "SPARSEMLA_MMA_DECODE",
    False,
    "Route sglang's DeepSeek-V4 sparse-MLA decode to the head-batched tensor-core Triton kernel.",
    aliases=("SGLANG_SM120_MMA_FLASHMLA",),
)
SPARSEMLA_TRITON_INDEXER = bool_flag(
    "SPARSEMLA_TRITON_INDEXER",
    False,
    "Route sglang's DeepSeek-V4 indexer logits (paged MQA logits) to the Triton kernel that only scans real lengths.",
)
SPARSEMLA_DSA_V32 = bool_flag(
    "SPARSEMLA_DSA_V32",
    False,
    "Give sglang's DeepSeek-V3.2 (DSA) backend a path on sm_80..sm_89 and sm_120: its auto-chosen backends without a "
    "kernel there (trtllm, fa3) become flashmla_kv (fp8 KV) / flashmla_sparse (bf16 KV), and its FlashMLA calls run "
    "sparsemla's V3.2 sparse decode and prefill kernels (on any GPU).",
)
SPARSEMLA_SPLIT_K = _register(
    Flag(
        "SPARSEMLA_SPLIT_K",
        "auto",
        "Split count of the decode kernel over the top-k tokens; `auto` fills the GPU's SMs.",
        "auto | a positive integer",
        _parse_split_k,
    )
)
SPARSEMLA_FORCE_REFERENCE = bool_flag(
    "SPARSEMLA_FORCE_REFERENCE",
    False,
    "Run the fp32 torch reference instead of the Triton kernels (bisecting numerical bugs; slow).",
)
SPARSEMLA_STEP_METRICS = bool_flag(
    "SPARSEMLA_STEP_METRICS",
    False,
    "Time every sglang decode forward step with CUDA events and export `sparsemla_decode_step_seconds`.",
)
SPARSEMLA_SELF_CHECK = bool_flag(
    "SPARSEMLA_SELF_CHECK",
    True,
    "Before serving, check each enabled kernel against its reference on a small random case; fail on mismatch.",
)
SPARSEMLA_LOG_LEVEL = choice_flag(
    "SPARSEMLA_LOG_LEVEL", "info", ("debug", "info", "warning", "error"), "Log level of sparsemla's own loggers."
)

# --------------------------------------------------------------------------------------------------------------------
# Ops loop (simulator, load test, exporter, dashboards)
# --------------------------------------------------------------------------------------------------------------------
SPARSEMLA_SIM_CALIBRATION = str_flag(
    "SPARSEMLA_SIM_CALIBRATION",
    None,
    "Calibration JSON the simulator takes its step times from (default: sparsemla/ops/sim/calibration/default.json).",
    group="ops",
    allowed="a path to a calibration JSON file",
)
SIM_GPUS = ("h200", "rtx-pro-6000", "l40s", "a100")  # sparsemla.ops.sim.calibration.GPU_FILES has one file each
SPARSEMLA_SIM_GPU = choice_flag(
    "SPARSEMLA_SIM_GPU",
    "h200",
    SIM_GPUS,
    "GPU whose shipped calibration the simulator runs (`sparsemla sim --gpu`): h200 is measured, the others are "
    "projected from the H200 runs (`sparsemla calibrate --project`); setting it together with "
    "SPARSEMLA_SIM_CALIBRATION is an error.",
    group="ops",
)
SPARSEMLA_RESULTS_DIR = str_flag(
    "SPARSEMLA_RESULTS_DIR",
    "results",
    "Where load tests, reports and snapshots are written.",
    group="ops",
    allowed="a directory path",
)
SPARSEMLA_SGLANG_COMMAND = str_flag(
    "SPARSEMLA_SGLANG_COMMAND",
    None,
    "Shell command `sparsemla up --server sglang` runs to start a local sglang (it must serve on the port passed to "
    "`up`, with --enable-metrics); empty: use an sglang already listening there.",
    group="ops",
    allowed="a shell command line",
)
GRAFANA_URL = str_flag(
    "GRAFANA_URL",
    None,
    "Grafana base URL; when set, A/B runs post annotations there.",
    group="ops",
    allowed="http(s)://host:port",
)
GRAFANA_API_TOKEN = str_flag(
    "GRAFANA_API_TOKEN", None, "Bearer token for posting Grafana annotations.", group="ops", allowed="a Grafana token"
)
SPARSEMLA_LOADTEST_API_KEY = str_flag(
    "SPARSEMLA_LOADTEST_API_KEY",
    None,
    "Bearer token the load test's Locust process sends to the target. `--api-key` of `sparsemla loadtest`, `sweep` "
    "and `ab` sets it in Locust's environment only, so the key never appears on a command line (`ps`).",
    group="ops",
    allowed="an API key",
)

# --------------------------------------------------------------------------------------------------------------------
# Set by others, read here (never set by users for sparsemla)
# --------------------------------------------------------------------------------------------------------------------
PROMETHEUS_MULTIPROC_DIR = str_flag(
    "PROMETHEUS_MULTIPROC_DIR",
    None,
    "Set by sglang when it serves metrics from several processes; the plugin writes its metrics there too.",
    group="external",
    allowed="a directory path",
)
TRITON_INTERPRET = bool_flag(
    "TRITON_INTERPRET",
    False,
    "Triton's CPU interpreter; the kernels upcast `tl.dot` operands to fp32 under it (bf16 dots are wrong there).",
    group="external",
)
TRITON_OVERRIDE_ARCH = str_flag(
    "TRITON_OVERRIDE_ARCH",
    None,
    "Triton compiles for this architecture instead of the GPU's (e.g. `sm89` on an H200: the mma.sync code path of "
    "sm_80..sm_120); the kernels then choose that target's configurations and shared-memory budget.",
    group="external",
    allowed="smNN (e.g. sm80, sm89, sm120)",
)
SGLANG_TORCH_PROFILER_DIR = str_flag(
    "SGLANG_TORCH_PROFILER_DIR",
    "/tmp",
    "Where sglang (and the simulator) write profiler traces; the kernel-share exporter reads them there.",
    group="external",
    allowed="a directory path",
)
CI = bool_flag("CI", False, "Set by CI runners; end-to-end tests use shorter durations under it.", group="external")


def kernel_flags() -> list[Flag[Any]]:
    """The flags that decide which kernels sglang runs (the labels of `sparsemla_kernel_flags_info`)."""
    return [f for f in REGISTRY.values() if f.group == "kernels"]


def validate_all() -> None:
    """Parse every declared flag once; raise FlagError listing every bad one (called at startup, loudly)."""
    errors = []
    for flag in REGISTRY.values():
        try:
            flag.get()
        except FlagError as exc:
            errors.append(str(exc))
    if errors:
        raise FlagError("; ".join(errors))


def child_env(
    overrides: Mapping[str, str | None] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A copy of this process's environment for a subprocess, with ``overrides`` applied (None removes a variable).

    The aliases of an overridden flag are removed too, so that an override cannot be shadowed by an alias."""
    env = dict(os.environ if base is None else base)
    for key, value in (overrides or {}).items():
        flag = REGISTRY.get(key)
        for alias in flag.aliases if flag is not None else ():
            env.pop(alias, None)
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def markdown_table() -> str:
    """The flags documentation (docs/flags.md), generated from the registry."""
    lines = [
        "# Flags",
        "",
        "Generated from `sparsemla/flags.py` by `sparsemla flags --markdown > docs/flags.md`; a test fails when stale.",
        "Every variable is read only through `sparsemla.flags`. Kernel flags default off and are read in every sglang",
        "process; an explicitly enabled kernel that cannot run fails at startup.",
        "",
    ]
    titles = {"kernels": "Kernel switches", "ops": "Ops loop", "external": "Set by other programs"}
    for group, title in titles.items():
        lines += [f"## {title}", "", "| Variable | Default | Allowed | Effect |", "|---|---|---|---|"]
        for flag in REGISTRY.values():
            if flag.group != group:
                continue
            default = flag.default
            if isinstance(default, bool):
                default = "1" if default else "0"
            name = f"`{flag.name}`" + (f" (alias `{'`, `'.join(flag.aliases)}`)" if flag.aliases else "")
            lines.append(f"| {name} | `{default if default is not None else ''}` | {flag.allowed} | {flag.help} |")
        lines.append("")
    return "\n".join(lines)
