"""Front door ``metrics``: Prometheus metrics of the broker on ``GET /metrics``."""
