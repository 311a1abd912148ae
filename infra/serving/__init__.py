"""Releasing registered model versions onto the model servers: the release steps, the canary judge, the
Prometheus queries it reads and the model registry client."""
