"""sparsemla: portable Triton kernels for DeepSeek sparse attention, an sglang plugin, and the ops loop around them.

Import namespaces: ``sparsemla.kernels`` (ops), ``sparsemla.deploy`` (plugin, simulator, exporter),
``sparsemla.loadtest`` (Locust), ``sparsemla.dashboards`` (Grafana as code). Nothing heavy is imported here.
"""

__version__ = "0.1.0"
