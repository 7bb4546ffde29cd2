"""The variant protocol: which kernel set a process runs, named once, published once, parsed once.

A *variant* is the short, stable name of a kernel-flag state. A/B dashboards, the simulator's calibration states, the
decode-step benchmark, the kernel-share exporter and the load-test summaries all tell runs apart by it. It is made of
the boolean kernel switches that are on, in :data:`SWITCHES` order, joined by ``+``; no switch on is ``baseline``:

    baseline | mma_decode | triton_indexer | mma_decode+triton_indexer          (:data:`VARIANTS`, a closed set)

A process whose ``SPARSEMLA_FORCE_REFERENCE=1`` runs the torch references instead of the Triton kernels reports the
variant with ``+reference`` appended (never a calibration state). ``SPARSEMLA_DISABLE=1`` is ``baseline``.

On the wire the variant travels as one Prometheus series, exported by the sglang plugin and by the simulator on the
server's ``/metrics`` and read back by the exporter and the load generator::

    sparsemla_kernel_flags_info{sparsemla_mma_decode="on", ..., version="0.1.0", variant="mma_decode"} 1

:func:`publish` writes it, :func:`info_from_metrics` / :func:`from_metrics` read it. Adding a kernel switch means one
entry in :data:`SWITCHES` (and its flag in :mod:`sparsemla.flags`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sparsemla import __version__, flags
from sparsemla.metric_names import KERNEL_FLAGS_INFO

BASELINE = "baseline"
UNKNOWN = "unknown"  # what a reader reports for a server that exports no flag-info series (stock sglang)
SEPARATOR = "+"
REFERENCE = "reference"
INFO_HELP = "Active sparsemla kernel flags (value 1)."

# The boolean kernel switches that make up a variant, in name order.
# SPARSEMLA_DSA_V32 is deliberately not one: it gives DeepSeek-V3.2 a path on GPUs where sglang has none (sm_8x,
# sm_12x), so there is no sglang arm to A/B it against there; it serves another model than the DeepSeek-V4 A/B these
# names, calibration states and dashboards describe; and adding it would double the closed set and rename nothing
# measured. It is still a kernel flag: its value is a label of the flag-info series (``sparsemla_dsa_v32``).
SWITCHES: tuple[flags.Flag[bool], ...] = (flags.SPARSEMLA_MMA_DECODE, flags.SPARSEMLA_TRITON_INDEXER)


class VariantError(ValueError):
    """A variant name outside the closed set; the message lists the allowed names."""


def part_name(switch: flags.Flag[bool]) -> str:
    """The name a switch has inside a variant: ``SPARSEMLA_MMA_DECODE`` -> ``mma_decode``."""
    return switch.name.removeprefix("SPARSEMLA_").lower()


def label_name(switch: flags.Flag[bool]) -> str:
    """A switch's label on ``sparsemla_kernel_flags_info``: ``SPARSEMLA_MMA_DECODE`` -> ``sparsemla_mma_decode``."""
    return switch.name.lower()


PARTS: tuple[str, ...] = tuple(part_name(s) for s in SWITCHES)


def compose(on: Iterable[str]) -> str:
    """The variant name of a set of switch part names (any order): ``{"triton_indexer"}`` -> ``triton_indexer``."""
    wanted = set(on)
    unknown = wanted - set(PARTS)
    if unknown:
        raise VariantError(f"unknown kernel switch {sorted(unknown)}; the switches are {', '.join(PARTS)}")
    return SEPARATOR.join(p for p in PARTS if p in wanted) or BASELINE


# Every state, fewest switches first (baseline first, all switches on last).
VARIANTS: tuple[str, ...] = tuple(compose(c) for n in range(len(PARTS) + 1) for c in itertools.combinations(PARTS, n))
ALL_ON: str = compose(PARTS)


@dataclass(frozen=True)
class Variant:
    """A parsed variant: which switches are on, and whether the torch references stand in for the kernels."""

    on: frozenset[str]
    reference: bool = False

    @property
    def name(self) -> str:
        base = compose(self.on)
        return f"{base}{SEPARATOR}{REFERENCE}" if self.reference and self.on else base

    def is_on(self, switch: flags.Flag[bool]) -> bool:
        """Whether ``switch`` (e.g. ``flags.SPARSEMLA_MMA_DECODE``) is on in this variant."""
        return part_name(switch) in self.on

    def flag_labels(self) -> dict[str, str]:
        """The switches as flag-info labels: ``{"sparsemla_mma_decode": "on", "sparsemla_triton_indexer": "off"}``."""
        return {label_name(s): "on" if self.is_on(s) else "off" for s in SWITCHES}


def parse(name: str, *, allow_reference: bool = False) -> Variant:
    """Parse a variant name of the closed set (``+reference`` accepted only with ``allow_reference``)."""
    parts = name.split(SEPARATOR)
    reference = parts[-1] == REFERENCE and len(parts) > 1
    if reference:
        parts = parts[:-1]
        if not allow_reference:
            raise VariantError(f"{name!r} names the torch references; expected one of {', '.join(VARIANTS)}")
    on = frozenset() if parts == [BASELINE] else frozenset(parts)
    try:
        canonical = compose(on)
    except VariantError:
        canonical = None
    if canonical != SEPARATOR.join(parts):
        raise VariantError(f"unknown variant {name!r}; expected one of {', '.join(VARIANTS)}")
    return Variant(on, reference)


def current(applied: Iterable[str] | None = None) -> str:
    """The variant this process runs, from its flags (``SPARSEMLA_DISABLE=1`` is ``baseline``).

    ``applied``: the switch part names whose hooks are actually in place (the sglang plugin passes what sglang
    applied); a switch that is on but not in ``applied`` does not count. None: the flags alone decide."""
    if flags.SPARSEMLA_DISABLE.get():
        return BASELINE
    on = frozenset(part_name(s) for s in SWITCHES if s.get())
    if applied is not None:
        on &= frozenset(applied)
    return Variant(on, reference=bool(on) and flags.SPARSEMLA_FORCE_REFERENCE.get()).name


def flag_labels() -> dict[str, str]:
    """Every kernel flag's current value as a label string (``sparsemla_<flag>``), for logs, metrics and summaries."""
    return {f.name.lower(): f.as_label() for f in flags.kernel_flags()}


def info_labels(applied: Iterable[str] | None = None) -> dict[str, str]:
    """The label set of this process's ``sparsemla_kernel_flags_info`` series (``applied``: see :func:`current`)."""
    return {**flag_labels(), "version": __version__, "variant": current(applied)}


def publish(
    registry: Any = None, *, multiprocess_mode: str | None = None, applied: Iterable[str] | None = None
) -> bool:
    """Export ``sparsemla_kernel_flags_info{<flags>, version, variant} 1`` (on ``registry``, default the global one).

    ``multiprocess_mode`` is passed to prometheus_client when sglang serves /metrics through its multiprocess collector.
    ``applied`` restricts the variant to the switches whose hooks are in place (see :func:`current`); the flag labels
    still say what was set. Returns False when the series is already registered there (a second call in one
    process)."""
    from prometheus_client import REGISTRY, Gauge

    labels = info_labels(applied)
    kwargs: dict[str, Any] = {"registry": REGISTRY if registry is None else registry}
    if multiprocess_mode:
        kwargs["multiprocess_mode"] = multiprocess_mode
    try:
        gauge = Gauge(KERNEL_FLAGS_INFO, INFO_HELP, list(labels), **kwargs)
    except ValueError:  # already registered
        return False
    gauge.labels(**labels).set(1)
    return True


def info_from_metrics(metrics_text: str) -> dict[str, str]:
    """The label set of the ``sparsemla_kernel_flags_info`` sample with value 1 in a Prometheus text page.

    ``{}`` when the page has none (stock sglang) or cannot be parsed (a malformed page is the server's problem)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name != KERNEL_FLAGS_INFO:
                continue
            for sample in family.samples:
                if sample.value == 1:
                    return dict(sample.labels)
    except ValueError:
        return {}
    return {}


def from_metrics(metrics_text: str) -> str:
    """The ``variant`` a server reports on its ``/metrics`` page, :data:`UNKNOWN` when it reports none."""
    return info_from_metrics(metrics_text).get("variant") or UNKNOWN
