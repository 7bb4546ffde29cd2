"""sparsemla.dashboards: Grafana dashboards as code, lint, and PNG renders (talks to Prometheus over HTTP only)."""
