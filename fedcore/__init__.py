"""fedcore: the pure-PyTorch federated core of fedapt.

Partitioners, datasets, client training, aggregation, payload/byte accounting and the
simulation engine. Imports torch/numpy (and torchvision for dataset files) only: no Prefect,
MLflow, boto3, pandera or great_expectations here (those live in ``tasks/``).
"""

__version__ = "0.1.0"
