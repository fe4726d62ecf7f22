"""Fixtures of the flows' tests: a temporary Prefect server for a module's flow runs."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def prefect_server():
    """One temporary Prefect server (real API, SQLite) for the flow runs of a module."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
