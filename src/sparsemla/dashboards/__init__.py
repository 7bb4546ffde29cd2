"""sparsemla.dashboards: Grafana dashboards as code, lint, and PNG snapshots (talks to Prometheus over HTTP only)."""
