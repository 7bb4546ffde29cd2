"""sparsemla.plugin: what runs inside sglang's processes — the hook table, the self-check, per-step metrics.

Imports kernels and flags only; nothing from ops, loadtest or dashboards (the GPU image ships without them).
"""
