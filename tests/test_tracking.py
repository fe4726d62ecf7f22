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
