"""GPU benchmarks of the kernels and of a DeepSeek-V4-Flash decode step (write results/bench/*.json)."""
