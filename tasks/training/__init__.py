"""A cell's run: its model, the federated rounds, checkpoints, outputs, personalization,
registration, and the seeds of a sweep."""
