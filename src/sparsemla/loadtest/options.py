"""The options every load-test command shares, declared once: `sparsemla loadtest | sweep | ab` and the demo.

Each field of :class:`LoadOptions` carries its CLI declaration (flag, help, bounds) next to its type and default, so a
new option is one line here and appears in every command. :func:`with_load_options` puts those fields into a typer
command's signature in place of its ``opts: LoadOptions`` parameter and hands the command one bound
:class:`LoadOptions`; :meth:`LoadOptions.config` turns it plus a concurrency into the runner's ``LoadTestConfig``.
The demo builds a :class:`LoadOptions` directly (its own, shorter options stay its own).

Light on purpose (typer and the standard library only): every CLI module is imported at `sparsemla` start-up, and the
runner pulls in scipy, so it is imported only when a configuration is built.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from sparsemla import ports
from sparsemla.loadtest.workload import DEFAULT_WORKLOAD

if TYPE_CHECKING:
    from sparsemla.loadtest.runner import LoadTestConfig

DEFAULT_TARGET = f"http://127.0.0.1:{ports.PORT_SERVER}"
OPTS_PARAMETER = "opts"  # the parameter of a command that receives the bound LoadOptions

R = TypeVar("R")
DEFAULT_MAX_ERROR_RATE = 0.05
# Bounds of the numeric options (the runner's LoadTestConfig.validate checks the same for callers without a CLI).
MAX_PROCESSES = 256
MAX_OUTPUT_TOKENS = 10_000_000
MAX_SEED = 2**32 - 1
MIN_SECONDS = 0.001
MAX_CONCURRENCY = 100_000  # users of one point (the runner checks it too); far above what one client can drive


def _check_run_id(value: str | None) -> str | None:
    """``--run-id``: a plain name (see :func:`sparsemla.loadtest.runner.validate_run_id`), else a usage error."""
    if value is None:
        return None
    from sparsemla.loadtest.runner import validate_run_id

    try:
        return validate_run_id(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _option(default: Any, *decls: str, **kw: Any) -> Any:
    """A dataclass field whose metadata holds its typer declaration (``typer.Option(default, *decls, **kw)``)."""
    return dataclasses.field(default=default, metadata={"typer": (decls, kw)})


@dataclass(frozen=True)
class LoadOptions:
    """What `loadtest`, `sweep`, `ab` and the demo share: the target, the workload and how a point is measured.

    Field order is the order of the options in ``--help``. ``run_id`` names the run directory (the command's
    business, not part of a point's config); ``--prometheus`` is not here because only the commands that write an A/B
    report have it (`ab`, `compare`)."""

    duration: str = _option("60s", "--duration", help="Measured time per point (warmup comes on top), e.g. 60s, 2m.")
    target: str = _option(DEFAULT_TARGET, "--target", help="Base URL of the server under test.")
    workload: str = _option(
        DEFAULT_WORKLOAD, "--workload", help="random:IN:OUT[:R] | sharegpt:PATH[:OUT] | shared-prefix:G:P:Q:O"
    )
    run_id: str | None = _option(
        None,
        "--run-id",
        callback=_check_run_id,
        help="Name of the run directory (default: a timestamp; letters, digits, . _ -). Reuse to resume.",
    )
    api: str = _option("chat", "--api", help="chat (/v1/chat/completions) | completions (/v1/completions) | generate.")
    warmup: str | None = _option(
        None, "--warmup", help="Warmup excluded from the numbers (default: 15 % of duration, 1-10 s)."
    )
    seed: int = _option(0, "--seed", min=0, max=MAX_SEED, help="Workload seed.")
    processes: int = _option(
        1, "--processes", min=1, max=MAX_PROCESSES, help="Locust processes (use >1 when one core cannot keep up)."
    )
    api_key: str = _option("", "--api-key", help="Bearer token for the target (passed to Locust in its environment).")
    max_tokens: int = _option(
        0, "--max-tokens", min=0, max=MAX_OUTPUT_TOKENS, help="Override the workload's output length (0: workload's)."
    )
    ignore_eos: bool = _option(
        True, "--ignore-eos/--no-ignore-eos", help="Always generate max_tokens (comparable runs)."
    )
    ttft_slo: float = _option(
        2.0, "--ttft-slo", min=MIN_SECONDS, max=3600.0, help="Goodput SLO on time to first token (s)."
    )
    tpot_slo: float = _option(
        0.1, "--tpot-slo", min=MIN_SECONDS, max=3600.0, help="Goodput SLO on time per output token (s)."
    )
    metrics_port: int = _option(
        ports.PORT_LOCUST_METRICS, "--metrics-port", min=0, max=65535, help="Client Prometheus metrics port (0: off)."
    )
    request_timeout: float = _option(
        600.0, "--request-timeout", min=0.1, max=86400.0, help="Seconds before a request counts as a timeout."
    )
    max_error_rate: float = _option(
        DEFAULT_MAX_ERROR_RATE,
        "--max-error-rate",
        min=0.0,
        max=1.0,
        help="Exit non-zero (1) when a point's share of failed requests is above this (0..1; 1: never).",
    )

    def config(self, concurrency: int) -> LoadTestConfig:
        """The runner's configuration of one point at ``concurrency``, validated.

        Raises ValueError (a bad duration, URL, API, ...) or WorkloadError (a bad workload spec) saying why."""
        from sparsemla.loadtest.runner import LoadTestConfig, parse_duration

        cfg = LoadTestConfig(
            target=self.target,
            concurrency=concurrency,
            duration_s=parse_duration(self.duration),
            workload=self.workload,
            api=self.api,
            warmup_s=_warmup_s(self.warmup),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            max_tokens=self.max_tokens,
            api_key=self.api_key,
            request_timeout_s=self.request_timeout,
            processes=self.processes,
            metrics_port=self.metrics_port,
            ttft_slo_s=self.ttft_slo,
            tpot_slo_s=self.tpot_slo,
        )
        cfg.validate()
        return cfg


def _warmup_s(warmup: str | None) -> float | None:
    """``--warmup``: None (unset: the runner's automatic warmup), 0 for ``0`` or ``0s``, else a duration."""
    from sparsemla.loadtest.runner import parse_duration

    if warmup is None:
        return None
    return 0.0 if warmup in ("0", "0s") else parse_duration(warmup)


def option_parameters() -> list[inspect.Parameter]:
    """One keyword-only typer parameter per :class:`LoadOptions` field, in field order."""
    hints = typing.get_type_hints(LoadOptions)
    params = []
    for f in dataclasses.fields(LoadOptions):
        decls, kw = f.metadata["typer"]
        default = typer.Option(f.default, *decls, **kw)
        params.append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name])
        )
    return params


def with_load_options(command: Callable[..., R]) -> Callable[..., R]:
    """Decorate a typer command: its ``opts: LoadOptions`` parameter becomes the shared options (at its position in
    ``--help``), and the command is called with them bound into one :class:`LoadOptions`.

    Typer reads a command's parameters from its signature (``__signature__`` wins) and calls it with keywords, so the
    wrapper only has to publish the combined signature and fold the shared keywords back into the dataclass."""
    signature = inspect.signature(command, eval_str=True)
    own = list(signature.parameters.values())
    names = [p.name for p in own]
    if OPTS_PARAMETER not in names:
        raise TypeError(f"{command.__name__} has no {OPTS_PARAMETER!r} parameter to put the load-test options in")
    shared = option_parameters()
    clash = {p.name for p in shared} & set(names)
    if clash:
        raise TypeError(f"{command.__name__} declares shared load-test options itself: {sorted(clash)}")
    at = names.index(OPTS_PARAMETER)
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[:at] + shared + own[at + 1 :]]
    shared_names = [p.name for p in shared]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> R:
        opts = LoadOptions(**{name: kwargs.pop(name) for name in shared_names})
        return command(**{OPTS_PARAMETER: opts}, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    return wrapper
