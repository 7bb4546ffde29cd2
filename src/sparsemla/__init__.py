"""sparsemla: portable Triton kernels for DeepSeek sparse attention, an sglang plugin, and the ops loop around them.

The runtime (in sglang's processes): ``sparsemla.kernels`` (ops), ``sparsemla.plugin`` (hook table, self-check, step
metrics), ``sparsemla.flags``. Out of process: ``sparsemla.ops`` (simulator, exporter, stack, demo),
``sparsemla.loadtest`` (Locust), ``sparsemla.dashboards`` (Grafana as code). Nothing heavy is imported here.
"""

__version__ = "0.1.0"
# The sglang release the plugin hooks, the simulator mimics and sglang_metrics was read from (one place in code).
SGLANG_VERSION = "0.5.23"
