"""sparsemla.ops: out-of-process tools — the simulator, the kernel-share exporter, the process stack and the demo."""
