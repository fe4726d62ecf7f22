"""Registry logic against a real local MLflow store (SQLite, in a temporary folder)."""

from __future__ import annotations

import pytest

from fedcore.errors import ConfigError
from tasks import tracking


def test_champion_is_best_accuracy(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    from mlflow import MlflowClient

    client = MlflowClient(tracking.tracking_uri())
    client.create_registered_model("m")
    for acc in (0.5, 0.9, 0.7):
        mv = client.create_model_version("m", source=str(tmp_path))
        client.set_model_version_tag("m", mv.version, "final_accuracy", str(acc))
    assert tracking.update_champion("m") == "2"
    assert str(client.get_model_version_by_alias("m", "champion").version) == "2"


def test_unreachable_server_is_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="not reachable") as exc:
        tracking.check_tracking_server("http://127.0.0.1:9", timeout=1)
    assert "\n" not in str(exc.value)
    tracking.check_tracking_server("sqlite:///x.db")  # local stores need no server


def test_personalization_metrics_per_client(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    from mlflow import MlflowClient

    client = MlflowClient(tracking.tracking_uri())
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    clients = [
        {"client": c, "accuracy_before": 0.5, "accuracy_after": 0.5 + 0.1 * c, "gain": 0.1 * c}
        for c in range(3)
    ]
    personal = {"mean_accuracy_before": 0.5, "mean_accuracy_after": 0.6, "mean_gain": 0.1}
    tracking.log_final_metrics(
        run_id,
        {"final_accuracy": 0.7, "personalization": {"payload": {**personal, "clients": clients}}},
    )
    history = client.get_metric_history(run_id, "personal_payload_gain")
    # one point per client (step = client id), the means under their own names
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(0, 0.0), (1, 0.1), (2, 0.2)]
    metrics = client.get_run(run_id).data.metrics
    assert metrics["personal_payload_mean_gain"] == 0.1
    assert metrics["final_accuracy"] == 0.7
