"""What a run leaves for people: the report and its figures, progress, artifacts in MLflow and
S3, and where a run's results live (its origin)."""
