"""PromQL helpers shared by the dashboard lint, the end-to-end test and the PNG renderer.

Grafana expands its own macros (``$__rate_interval``, ``$__range``, ...) and template variables before a query reaches
Prometheus. :func:`expand` does the same for one query, so the exact string Grafana would send can be parsed
(``promql-parser``, the Rust parser Prometheus-compatible tools use) or executed against a real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import promql_parser

# `$name`, `${name}` and `[[name]]` (the legacy syntax), optionally `${name:fmt}`.
_VAR_RE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")
# Functions whose range argument Grafana users should size with $__rate_interval.
RATE_FUNCTIONS = frozenset({"rate", "irate", "increase"})


@dataclass(frozen=True)
class Interval:
    """Grafana's interval macros for one query: ``step`` and ``scrape`` in seconds, ``range_s`` the time range."""

    step_s: float
    range_s: float
    scrape_s: float = 5.0

    @property
    def rate_interval_s(self) -> float:
        """Grafana's ``$__rate_interval``: max($__interval + scrape interval, 4 x scrape interval)."""
        return max(self.step_s + self.scrape_s, 4 * self.scrape_s)

    def macros(self) -> dict[str, str]:
        """The macro values as Grafana substitutes them (durations in whole seconds)."""
        return {
            "__rate_interval": f"{round(self.rate_interval_s)}s",
            "__interval": f"{max(1, round(self.step_s))}s",
            "__interval_ms": str(round(self.step_s * 1000)),
            "__range": f"{round(self.range_s)}s",
            "__range_s": str(round(self.range_s)),
            "__range_ms": str(round(self.range_s * 1000)),
        }


def variable_names(text: str) -> set[str]:
    """Every template variable or macro referenced in ``text`` (without the ``$``)."""
    return {m.group(1) or m.group(3) or m.group(4) for m in _VAR_RE.finditer(text)}


def expand(text: str, values: Mapping[str, str]) -> str:
    """Replace ``$var``/``${var}``/``[[var]]`` in ``text`` with ``values``; KeyError names an unknown variable."""

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(4)
        if name not in values:
            raise KeyError(f"variable ${name} has no value (known: {', '.join(sorted(values))})")
        return values[name]

    return _VAR_RE.sub(repl, text)


_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


def regex_escape(value: str) -> str:
    r"""A value escaped for a regex inside a PromQL double-quoted string, as Grafana's Prometheus data source does it
    (``prometheusSpecialRegexEscape``): the regex escape is itself escaped for the string literal, so ``a+b`` becomes
    ``a\\+b`` in the query text (``a\+b`` once Prometheus has read the string). Python's ``re.escape`` would put
    ``a\+b`` in the text, which PromQL rejects ("unknown escape sequence"). Double quotes are escaped as well."""
    escaped = _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))
    return escaped.replace('"', '\\"')


def multi_value(selected: list[str]) -> str:
    """How Grafana formats a multi-value variable inside a ``=~`` matcher: a regex alternation of escaped values."""
    if len(selected) == 1:
        return regex_escape(selected[0])
    return "(" + "|".join(regex_escape(v) for v in selected) + ")"


def parse(expr: str) -> promql_parser.Expr:
    """Parse an expanded PromQL string; raises ValueError with the parser's message when it is not valid PromQL."""
    try:
        return promql_parser.parse(expr)
    except Exception as exc:  # the Rust parser raises a plain ValueError/RuntimeError depending on the version
        raise ValueError(f"invalid PromQL {expr!r}: {exc}") from None


def _walk(node: promql_parser.Expr, inside: tuple[str, ...] = ()) -> Iterator[tuple[object, tuple[str, ...]]]:
    """Yield (node, enclosing function names) depth-first; a matrix selector is a leaf (its selector is inside it)."""
    yield node, inside
    if isinstance(node, promql_parser.Call):
        for arg in node.args:
            yield from _walk(arg, (*inside, node.func.name))
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from _walk(node.lhs, inside)
        yield from _walk(node.rhs, inside)
    elif isinstance(node, promql_parser.AggregateExpr):
        if node.param is not None:
            yield from _walk(node.param, inside)
        yield from _walk(node.expr, inside)
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        yield from _walk(node.expr, inside)


@dataclass(frozen=True)
class SelectorUse:
    """One vector selector in a query: metric name, enclosing functions, range (s) if any, label matchers.

    ``matchers`` are (label, op, value) with op one of ``=``, ``!=``, ``=~``, ``!~``."""

    metric: str
    inside: tuple[str, ...]
    range_s: float | None
    matchers: tuple[tuple[str, str, str], ...] = ()

    def matcher(self, label: str) -> tuple[str, str] | None:
        """(op, value) of the matcher on ``label``, or None."""
        return next(((op, value) for name, op, value in self.matchers if name == label), None)


def selectors(expr: str) -> list[SelectorUse]:
    """Every vector selector of an (expanded) query, with the functions around it."""
    uses: list[SelectorUse] = []
    for node, inside in _walk(parse(expr)):
        if isinstance(node, promql_parser.MatrixSelector):
            vs = node.vector_selector
            uses.append(SelectorUse(_metric_name(vs), inside, node.range.total_seconds(), _matchers(vs)))
        elif isinstance(node, promql_parser.VectorSelector):
            uses.append(SelectorUse(_metric_name(node), inside, None, _matchers(node)))
    return uses


_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def _matchers(node: promql_parser.VectorSelector) -> tuple[tuple[str, str, str], ...]:
    return tuple(
        (mm.name, _OPS[str(mm.op).rsplit(".", 1)[-1]], mm.value)
        for mm in node.matchers.matchers
        if mm.name != "__name__"
    )


def _metric_name(node: promql_parser.VectorSelector) -> str:
    if node.name:
        return node.name
    for matcher in node.matchers.matchers:
        if matcher.name == "__name__":
            return matcher.value
    return ""


def metric_names(expr: str) -> set[str]:
    """The metric names an (expanded) query reads, e.g. ``{"sglang:generation_tokens_total"}``."""
    return {use.metric for use in selectors(expr) if use.metric}


def base_metric(name: str) -> str:
    """The family a sample name belongs to: histogram ``_bucket``/``_sum``/``_count`` suffixes stripped."""
    return re.sub(r"_(bucket|sum|count)$", "", name)
