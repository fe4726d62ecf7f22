from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("DO_NOT_TRACK", "true")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
