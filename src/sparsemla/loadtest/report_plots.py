"""The A/B report's plots: throughput, latency and per-user speed against concurrency, one curve per side (PNG).

A point where a side has no value for a metric (see :mod:`sparsemla.loadtest.report_cells`) has no marker on that
side's curve; the table says why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sparsemla.loadtest.report import METRICS, Metric, Run, estimate


def plot(a: Run, b: Run, out_dir: Path) -> list[Path]:
    """tok/s vs C, latency vs C, tok/s per user vs tok/s (PNG files, returned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    runs = (("A", a, "tab:blue"), ("B", b, "tab:orange"))

    def series(run: Run, metric: Metric) -> tuple[list[int], list[float], list[list[float]]]:
        cs, vals, errs = [], [], [[], []]
        for c in sorted(run.points):
            est = estimate(run.points[c], metric)
            if not math.isfinite(est.value):
                continue
            cs.append(c)
            vals.append(est.value)
            # matplotlib refuses negative error bars; an interval that misses its point shows as zero on that side
            errs[0].append(max(0.0, est.value - est.lo) if est.has_interval else 0.0)
            errs[1].append(max(0.0, est.hi - est.value) if est.has_interval else 0.0)
        return cs, vals, errs

    def finish_axes(ax: Any, xlabel: str, ylabel: str, title: str, legend_size: int, log_c: bool = True) -> None:
        if log_c:  # concurrency points are powers of two
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        files.append(out_dir / name)
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    tok = METRICS[0]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for side, run, color in runs:
        cs, vals, errs = series(run, tok)
        ax.errorbar(cs, vals, yerr=errs, marker="o", capsize=3, color=color, label=f"{side}: {run.name}")
    finish_axes(ax, "concurrency (users)", "output tok/s", "Throughput vs concurrency (95 % CI)", 8)
    save(fig, "throughput_vs_concurrency.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (p50, p99, title) in zip(
        axes, ((METRICS[1], METRICS[2], "TTFT"), (METRICS[3], METRICS[4], "ITL")), strict=True
    ):
        absent = []
        for side, run, color in runs:
            for metric, style in ((p50, "-"), (p99, "--")):
                cs, vals, errs = series(run, metric)
                ax.errorbar(
                    cs, [v * 1000 for v in vals], yerr=[[e * 1000 for e in errs[0]], [e * 1000 for e in errs[1]]],
                    marker="o", linestyle=style, capsize=3, color=color, label=f"{side} {metric.label}",
                )  # fmt: skip
            gone = [c for c in sorted(run.points) if c not in series(run, p50)[0]]
            absent += [f"{side} at C={', '.join(map(str, gone))}"] if gone else []
        if absent:  # a curve that just stops would read as "not measured": say where and where to look
            ax.text(0.99, 0.02, f"no {title}: {'; '.join(absent)} (the table says why)", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=7, color="dimgray")  # fmt: skip
        finish_axes(ax, "concurrency (users)", "ms", f"{title} vs concurrency", 7)
    save(fig, "latency_vs_concurrency.png")

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for side, run, color in runs:
        cs, vals, _ = series(run, tok)
        per_user = [v / c for v, c in zip(vals, cs, strict=True)]
        ax.plot(vals, per_user, marker="o", color=color, label=f"{side}: {run.name}")
        for c, x, y in zip(cs, vals, per_user, strict=True):
            ax.annotate(f"C={c}", (x, y), fontsize=7, textcoords="offset points", xytext=(4, 4))
    finish_axes(
        ax, "output tok/s (total)", "output tok/s per user", "Per-user speed vs total throughput", 8, log_c=False
    )
    save(fig, "per_user_vs_throughput.png")
    return files
