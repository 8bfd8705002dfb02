"""A run seen in a browser and by Prometheus: the page and the metrics, both views of `derive_status`."""
