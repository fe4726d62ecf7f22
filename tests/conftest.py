from __future__ import annotations

import os
import socket
import tempfile

import pytest

from fedcore import numerics

# The suite computes in portable numerics, the default of params.yaml (fedcore/numerics.py):
# in force before any test computes, so the commands tests run in this process may ask for
# it; tests of native numerics start processes of their own.
numerics.apply("portable")

import torch  # noqa: E402

os.environ.setdefault("DO_NOT_TRACK", "true")
# Tests never see the services of a developer's `fedapt up` (state in the repo's .fedapt/):
# their own state dir, inherited by the processes they start.
os.environ["FEDAPT_STATE_DIR"] = tempfile.mkdtemp(prefix="fedapt-test-state-")
# Nor a shell pointed at them by `eval "$(fedapt env)"`: the variables it set are dropped.
for _name in os.environ.pop("FEDAPT_ENV_VARS", "").split():
    os.environ.pop(_name, None)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_server():
    """An in-process S3 server (moto) on 127.0.0.1, in memory."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server


@pytest.fixture(autouse=True)
def _prefect_api_url_restored():
    """A test that runs a Dask or Ray grid in-process leaves PREFECT_API_URL naming its
    (temporary, now stopped) server for the workers (``flows/runners.py``): restored after
    each test, so a later test does not meet a dead server."""
    before = os.environ.get("PREFECT_API_URL")
    yield
    if before is None:
        os.environ.pop("PREFECT_API_URL", None)
    else:
        os.environ["PREFECT_API_URL"] = before


@pytest.fixture
def busy_port():
    """A port on 127.0.0.1 that something listens on (a service must refuse it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def repo_copy(tmp_path):
    """A copy of the repository in ``tmp_path/repo`` that `dvc repro` runs in (tiny params,
    the data, a git repository of its own): tests/repo/test_dvc.py, tests/flows/test_codec_grid.py."""
    from tests.repo.support import copy_repo

    return copy_repo(tmp_path)
