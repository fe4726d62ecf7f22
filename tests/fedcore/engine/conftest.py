"""Fixtures of the engine's tests: the local Ray of the Ray backends' modules."""

from __future__ import annotations

import shutil
import uuid

import pytest


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs on 127.0.0.1 in a temp dir of its own, shut down after."""
    ray = pytest.importorskip("ray")
    temp = f"/tmp/rcl-{uuid.uuid4().hex[:8]}"
    ray.init(
        num_cpus=2,
        num_gpus=0,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
