"""sparsemla.loadtest: Locust LLM user, concurrency sweeps and A/B reports (talks to servers over HTTP only)."""
