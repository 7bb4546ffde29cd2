"""Default TCP ports of the processes sparsemla starts or talks to (plain processes and compose alike)."""

from __future__ import annotations

PORT_SERVER = 30000  # sglang (or the simulator): sglang's own default
PORT_PROMETHEUS = 9090
PORT_EXPORTER = 9400  # the kernel-share exporter's /metrics and POST /snapshot
PORT_LOCUST_WEB = 8089
PORT_LOCUST_METRICS = 9646  # the Locust client's Prometheus metrics
