"""The platform's model registry (MLflow's Model Registry) as the CLI and the serving guard see it."""
