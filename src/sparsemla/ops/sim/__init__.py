"""sparsemla.ops.sim: a simulated sglang server whose step times come from measured kernels."""
