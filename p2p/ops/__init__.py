"""Operating a node: Prometheus metrics, the status page and health checks (``metrics``)."""
