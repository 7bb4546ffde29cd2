"""Kernel shares of two variants side by side: where the GPU time went before and after a flip.

The input is what the kernel-share exporter answers to ``POST /snapshot`` (the JSON `sparsemla profile --json`
prints, :class:`sparsemla.ops.exporter.Snapshot`): per kernel group its share of the summed GPU kernel time over the
profiled steps (the top 15 and one ``other`` row) and per category (attention, indexer, gemm, ...). A report shows
two tables, as the campaign this project comes from read its profiles ("attention 57 % of decode GPU time -> 17.6 %;
next: the indexer's FP32 GEMM and the copies around it"): the categories of A and B with the change in percentage
points, and the largest kernel groups of either side. A side without a snapshot, or a kernel outside a side's top
list, is said in words (never a blank cell).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOP_KERNELS = 8  # kernel groups per side in the report's table (the exporter keeps 15)
OTHER = "other"  # the exporter's row for the kernels outside its top list (sparsemla.traces.OTHER)


@dataclass
class ProfileSnapshot:
    """One variant's kernel-share snapshot as a campaign took it: the exporter's reply (``snapshot``) and the load
    it was taken under, or why there is none (``error``)."""

    variant: str
    concurrency: int | None = None
    snapshot: dict[str, Any] | None = None
    error: str | None = None
    path: Path | None = None

    @property
    def ok(self) -> bool:
        snap = self.snapshot or {}
        return snap.get("outcome") == "ok" and isinstance(snap.get("summary"), dict)

    @property
    def taken_at(self) -> float | None:
        """Unix time the snapshot was finished (its gauges are on the exporter's /metrics from then on)."""
        if not self.ok:
            return None
        snap = self.snapshot or {}
        return float(snap.get("started_at") or 0.0) + float(snap.get("duration_s") or 0.0)

    @property
    def summary(self) -> dict[str, Any]:
        return ((self.snapshot or {}).get("summary") or {}) if self.ok else {}

    def categories(self) -> dict[str, float]:
        return {str(k): float(v) for k, v in (self.summary.get("categories") or {}).items()}

    def kernels(self) -> list[dict[str, Any]]:
        """The kernel groups of the exporter's top list, largest first (its ``other`` row left out)."""
        rows = [k for k in self.summary.get("kernels") or [] if k.get("name") != OTHER]
        return sorted(rows, key=lambda k: -float(k.get("share") or 0.0))

    @property
    def gpu_us(self) -> float:
        """Summed GPU kernel time of the profiled steps (µs)."""
        return float(self.summary.get("total_gpu_us") or 0.0)

    def share_cell(self, share: float) -> str:
        """``72.5 % (4.24 s)``: a share and the GPU time it stands for in this snapshot."""
        return f"{_pct(share)} ({_duration(share * self.gpu_us * 1e-6)})"

    def why_none(self) -> str:
        """Why there is no snapshot, in words."""
        if self.ok:
            return ""
        snap = self.snapshot or {}
        reason = self.error or snap.get("error") or f"outcome {snap.get('outcome', 'unknown')}"
        return f"no kernel-share snapshot of {self.variant}: {reason}"

    def describe(self) -> str:
        """One line: which snapshot, under what load, how much GPU time it covers."""
        if not self.ok:
            return self.why_none()
        snap = self.snapshot or {}
        load = f" under C={self.concurrency}" if self.concurrency else ""
        where = f", {self.path}" if self.path else ""
        return (
            f"snapshot `{snap.get('profile_id')}`{load}: {_duration(self.gpu_us * 1e-6)} of GPU kernel time in the "
            f"profiled steps{where}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "concurrency": self.concurrency,
            "ok": self.ok,
            "error": self.why_none() or None,
            "path": str(self.path) if self.path else None,
            "snapshot": self.snapshot,
        }


def _pct(share: float) -> str:
    return f"{share * 100:.1f} %"


def _points(delta: float) -> str:
    return f"{delta * 100:+.1f} points".replace("-", "−")


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1000:.3g} ms"


@dataclass
class KernelComparison:
    """A's and B's snapshots, rendered as the report's kernel-share tables."""

    a: ProfileSnapshot
    b: ProfileSnapshot
    top: int = TOP_KERNELS

    def category_rows(self) -> list[list[str]]:
        """category, A share, B share, B − A; categories with time on either side, A's largest first."""
        if not (self.a.ok and self.b.ok):
            return []
        ca, cb = self.a.categories(), self.b.categories()
        names = [c for c in ca.keys() | cb.keys() if ca.get(c, 0.0) > 0 or cb.get(c, 0.0) > 0]
        names.sort(key=lambda c: (-ca.get(c, 0.0), -cb.get(c, 0.0)))
        return [
            [c, self.a.share_cell(ca.get(c, 0.0)), self.b.share_cell(cb.get(c, 0.0)),
             _points(cb.get(c, 0.0) - ca.get(c, 0.0))]
            for c in names
        ]  # fmt: skip

    def _share_cell(self, side: ProfileSnapshot, label: str, name: str) -> str:
        for k in side.kernels():
            if k.get("name") == name:
                return side.share_cell(float(k.get("share") or 0.0))
        listed = side.kernels()
        floor = min((float(k.get("share") or 0.0) for k in listed), default=0.0)
        return f"< {_pct(floor)} (not in {label}'s top {len(listed)})"

    def kernel_rows(self) -> list[list[str]]:
        """kernel group, category, A share, B share: the ``top`` largest groups of each side, largest first."""
        if not (self.a.ok and self.b.ok):
            return []
        chosen: dict[str, tuple[str, float]] = {}
        for side in (self.a, self.b):
            for k in side.kernels()[: self.top]:
                name, share = str(k.get("name")), float(k.get("share") or 0.0)
                if share > chosen.get(name, ("", -1.0))[1]:
                    chosen[name] = (str(k.get("category")), share)
        order = sorted(chosen, key=lambda n: -chosen[n][1])
        rows = [[n, chosen[n][0], self._share_cell(self.a, "A", n), self._share_cell(self.b, "B", n)] for n in order]
        rest = [side.share_cell(self._rest(side, order)) for side in (self.a, self.b)]
        rows.append(["all other kernel groups", "(mixed)", *rest])
        return rows

    @staticmethod
    def _rest(side: ProfileSnapshot, shown: list[str]) -> float:
        return max(0.0, 1.0 - sum(float(k.get("share") or 0.0) for k in side.kernels() if k.get("name") in shown))

    def headline(self, changes: int = 2) -> str:
        """The categories whose share of GPU time changed most, e.g. ``attention 72.5 % -> 0.7 %, copy 10.6 % ->
        38.6 %``."""
        if not (self.a.ok and self.b.ok):
            return self.a.why_none() or self.b.why_none()
        ca, cb = self.a.categories(), self.b.categories()
        names = sorted(ca.keys() | cb.keys(), key=lambda c: -abs(cb.get(c, 0.0) - ca.get(c, 0.0)))[:changes]
        return ", ".join(f"{c} {_pct(ca.get(c, 0.0))} → {_pct(cb.get(c, 0.0))}" for c in names)

    def _intro(self) -> list[str]:
        return [
            f"A ({self.a.variant}): {self.a.describe()}",
            f"B ({self.b.variant}): {self.b.describe()}",
            "Shares are of the summed GPU kernel time of the profiled forward steps (the exporter's --num-steps, "
            "decode and prefill steps as they came under load); in brackets the GPU time they stand for.",
        ]

    def markdown(self, level: int = 2) -> list[str]:
        lines = ["#" * level + " Kernel shares (GPU time, kernel-share exporter)", ""]
        lines += [f"- {line}" for line in self._intro()] + [""]
        if not (self.a.ok and self.b.ok):
            return lines + ["No before/after table: " + (self.a.why_none() or self.b.why_none()) + ".", ""]
        for headers, rows in self.tables():
            lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
        return lines

    def tables(self) -> list[tuple[list[str], list[list[str]]]]:
        """(headers, rows) of the category table and of the kernel-group table."""
        return [
            (["category", "A share (GPU time)", "B share (GPU time)", "B − A"], self.category_rows()),
            (["kernel group", "category", "A share (GPU time)", "B share (GPU time)"], self.kernel_rows()),
        ]

    def html(self, level: int = 2) -> str:
        parts = [f"<h{level}>Kernel shares (GPU time, kernel-share exporter)</h{level}>", "<ul>"]
        parts += [f"<li>{html.escape(line)}</li>" for line in self._intro()] + ["</ul>"]
        if not (self.a.ok and self.b.ok):
            parts.append(
                f"<p class='worse'>No before/after table: {html.escape(self.a.why_none() or self.b.why_none())}.</p>"
            )
            return "\n".join(parts)
        for headers, rows in self.tables():
            head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a.to_json(), "b": self.b.to_json(), "categories": self.category_rows(),
                "kernels": self.kernel_rows(), "headline": self.headline()}  # fmt: skip
