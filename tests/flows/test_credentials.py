"""Credentials in URIs (user:password@) are masked wherever fedapt prints or stores them."""

from __future__ import annotations

from tests.cli_contract import REPO


def test_credentials_are_masked_wherever_printed_or_stored(monkeypatch, caplog):
    """user:password@ -> user:***@ in the error line, the lines after a run, Prefect's log
    records (console and API) and the MLflow links of the Prefect results artifact."""
    import logging

    from fedcore.errors import mask_credentials
    from flows.cli import logs
    from flows.cli.experiment import where_results
    from tasks import tracking
    from tasks.config import load_params
    from tasks.data.experiment import load_experiment_data
    from tasks.results import artifacts

    assert (
        mask_credentials("at http://u:p@h:5000/x and s3://b/k")
        == "at http://u:***@h:5000/x and s3://b/k"
    )
    assert (
        mask_credentials("postgresql+psycopg2://u:p%40w@h/db") == "postgresql+psycopg2://u:***@h/db"
    )
    assert mask_credentials("sqlite:///a/b.db http://h:1") == "sqlite:///a/b.db http://h:1"

    uri = "https://fed:secret@mlflow.example:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    p = load_params(REPO / "params.yaml", ["storage.bucket=null"])
    lines = where_results(p, load_experiment_data(p), [])  # (no cell tracked: no table)
    assert "MLflow: https://fed:***@mlflow.example:5000" in lines, lines

    class Run:  # a unit test: the MLflow client is a stand-in
        class info:  # noqa: N801
            experiment_id = "7"

    class Client:
        def get_run(self, run_id):
            return Run()

    monkeypatch.setattr(tracking, "client", Client)
    links = artifacts.run_links([{"algorithm": "fedavg", "adapter": "full", "mlflow_run_id": "r"}])
    assert links == {
        "fedavg-full": "https://fed:***@mlflow.example:5000/#/experiments/7/runs/r"
        "?workflowType=machine_learning"
    }

    ray = load_params(REPO / "params.yaml", ["runtime.ray_address=ray://fed:secret@h:10001"])
    assert ray.flat()["runtime.ray_address"] == "ray://fed:***@h:10001"  # MLflow params, summary

    record = logging.LogRecord(
        "prefect.flow_runs", logging.ERROR, __file__, 1, "failed: %s", (uri,), None
    )
    assert logs.NoTracebackForFedaptErrors().filter(record)
    assert record.getMessage() == "failed: https://fed:***@mlflow.example:5000"
