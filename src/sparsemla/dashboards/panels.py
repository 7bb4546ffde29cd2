"""Read a Grafana dashboard JSON: its panels (rows flattened), targets and template variables.

Shared by the lint, the panel renderer and the tests, so all three see the dashboard exactly as Grafana does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class PanelRef:
    """One non-row panel: its JSON, the title of the row it sits in, and its targets' JSON."""

    panel: dict
    row: str

    @property
    def title(self) -> str:
        return self.panel.get("title", "")

    @property
    def kind(self) -> str:
        return self.panel.get("type", "")

    @property
    def targets(self) -> list[dict]:
        return [t for t in self.panel.get("targets", []) if not t.get("hide")]

    @property
    def unit(self) -> str | None:
        return self.panel.get("fieldConfig", {}).get("defaults", {}).get("unit")

    @property
    def profile(self) -> str | None:
        """The compose profile the panel needs, from its description's ``[profile X]`` prefix (None: always fed)."""
        desc = self.panel.get("description", "")
        if desc.startswith("[profile ") and "]" in desc:
            return desc[len("[profile ") : desc.index("]")]
        return None


def iter_panels(dashboard: dict) -> Iterator[PanelRef]:
    """Every non-row panel in layout order, including those nested in collapsed rows."""
    row = ""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            row = panel.get("title", "")
            for nested in panel.get("panels", []):
                yield PanelRef(nested, row)
            continue
        yield PanelRef(panel, row)


def all_panel_json(dashboard: dict) -> Iterator[dict]:
    """Every panel JSON object including rows (for id checks)."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: dict) -> list[dict]:
    return list(dashboard.get("templating", {}).get("list", []))
