"""sparsemla.deploy: the sglang plugin (hook table), metrics, the kernel-share exporter and the simulator."""
