"""Registry logic against a real local MLflow store (SQLite, in a temporary folder)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from fedcore.errors import ConfigError
from tasks import tracking

REPO = Path(__file__).resolve().parents[3]


def test_champion_moves_only_to_a_better_version_on_the_same_evaluation_set(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    from mlflow import MlflowClient

    client = MlflowClient(tracking.tracking_uri())
    client.create_registered_model("m")

    def register(acc, eval_set="full", tag="final_accuracy_pct"):
        mv = client.create_model_version("m", source=str(tmp_path))
        if acc is not None:  # in % (a version registered before the unit was %: in 0-1)
            shown = acc if tag == "final_accuracy" else 100 * acc
            client.set_model_version_tag("m", mv.version, tag, str(shown))
        if eval_set is not None:
            client.set_model_version_tag("m", mv.version, tracking.EVAL_SET_TAG, eval_set)
        return tracking.update_champion("m", str(mv.version))

    assert register(None) is None  # never evaluated: no champion
    assert register(0.5) == "2"  # the first with an accuracy
    assert register(0.9) == "3"  # better on the same evaluation set
    assert register(0.7) == "3"  # worse: champion stays
    assert register(0.99, eval_set="500-images") == "3"  # another test set: not comparable
    assert register(0.9) == "3"  # a tie does not move it
    assert str(client.get_model_version_by_alias("m", "champion").version) == "3"
    client.delete_model_version_tag("m", "3", tracking.EVAL_SET_TAG)  # registered before tags
    assert register(0.95, eval_set="other") == "7"  # compared by accuracy alone
    # versions tagged in 0-1 before the unit was %: compared in % all the same
    assert register(0.96, eval_set="other", tag="final_accuracy") == "8"
    assert register(0.955, eval_set="other") == "8"
    assert register(0.97, eval_set="other") == "10"


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
    history = client.get_metric_history(run_id, "personal_payload_gain_pct")
    # one point per client (step = client id), the means under their own names; in %
    assert sorted((m.step, round(m.value, 6)) for m in history) == [(0, 0), (1, 10), (2, 20)]
    metrics = client.get_run(run_id).data.metrics
    assert metrics["personal_payload_mean_gain_pct"] == pytest.approx(10)
    assert metrics["final_accuracy_pct"] == pytest.approx(70)


def test_charts_mib_percent_and_constants_as_params(tmp_path, monkeypatch):
    """What the MLflow charts get (issue 46): accuracy in % (the unit of every results
    table, named _pct), traffic in MiB and cumulative per round, no flat lines (a round's
    MiB, the method's sizes: params), no series of zeros (rejections counted from the first)."""
    from mlflow import MlflowClient

    from fedcore.events import History, RoundRecord

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    client = MlflowClient(tracking.tracking_uri())
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    mib = 2**20
    rounds, history = tracking.MlflowRounds(run_id), History(last_rounds=2)
    for k, rejected in ((1, 0), (2, 1), (3, 0)):
        extra = {"test_accuracy_exit_1": 0.5, "tau": 1.0 if k < 3 else 2.0, "freeze": 0.0}
        # round, lr, clients, down, up, cum down, cum up, train loss, acc, test loss, ...
        rec = (k, 0.1, (0, 1), 2 * mib, mib, 2 * k * mib, k * mib, 1.0, 0.25 * k, 0.9)
        history.rounds.append(RoundRecord(*rec, rejected, 1.5, extra))
        rounds.on_round_end(history.rounds[-1])
    rounds.on_fit_end(history)
    record = {
        "final_accuracy": 0.75, "mean_accuracy_last_L": 0.5, "upload_bytes": 3 * mib,
        "download_bytes": 6 * mib, "upload_bytes_per_round": mib,
        "download_bytes_per_round": 2 * mib, "payload_bytes": mib // 2, "model_bytes": mib,
        "base_download_bytes": 0, "total_params": 1000, "trainable_params": 10,
        "wall_seconds": 3.0, "diverged_at_round": None,
    }  # fmt: skip
    tracking.log_final_metrics(run_id, record)
    run = client.get_run(run_id)

    def series(name):
        return [(m.step, m.value) for m in client.get_metric_history(run_id, name)]

    assert series("test_accuracy_pct") == [(1, 25.0), (2, 50.0), (3, 75.0)]
    assert series("test_accuracy_exit_1_pct") == [(1, 50.0), (2, 50.0), (3, 50.0)]
    assert series("cum_upload_mib") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert series("cum_download_mib") == [(1, 2.0), (2, 4.0), (3, 6.0)]
    assert series("cum_rejected_updates") == [(2, 1.0), (3, 1.0)]
    assert series("tau") == [(1, 1.0), (2, 1.0), (3, 2.0)]  # changed: its whole curve
    assert series("lr") == series("freeze") == []  # never changed: params
    m = run.data.metrics
    assert (m["final_accuracy_pct"], m["mean_accuracy_last_L_pct"]) == (75.0, 50.0)
    assert (m["upload_mib"], m["download_mib"], m["last_rounds_L"]) == (3.0, 6.0, 2.0)
    assert not {"upload_bytes", "download_bytes", "total_upload_bytes", "final_accuracy",
                "test_accuracy", "base_download_bytes", "payload_bytes"} & set(m)  # fmt: skip
    assert {k: v for k, v in run.data.params.items()} == {
        "upload_mib_per_round": "1.0000", "download_mib_per_round": "2.0000",
        "payload_mib": "0.5000", "model_mib": "1.0000", "base_download_mib": "0.0000",
        "total_params": "1000", "trainable_params": "10", "lr": "0.1", "freeze": "0",
    }  # fmt: skip
    tracking.log_metrics(run_id, {"fedavg-full/final_accuracy_std": 0.01, "f/n_seeds": 2})
    m = client.get_run(run_id).data.metrics
    assert m["fedavg-full/final_accuracy_std_pct"] == pytest.approx(1.0) and m["f/n_seeds"] == 2


def test_runs_table_link_opens_the_training_view_with_the_result_columns(tmp_path, monkeypatch):
    """The link fedapt prints: the training view (workflowType), and a shared view stored
    as an experiment tag (MLflow UI's own "Share"): the parent's cells, result columns."""
    import json
    from urllib.parse import parse_qs

    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    client = MlflowClient(tracking.tracking_uri())
    parent = tracking.start_experiment_run("e", {})
    cell = tracking.start_cell_run("e", parent, "fedavg-full", {}, {})
    assert tracking.parent_run([{"mlflow_run_id": cell}, {}]) == parent
    assert tracking.parent_run([{"algorithm": "fedavg"}]) is None
    url = tracking.runs_table_url(parent, uri="https://fed:secret@mlflow.example:5000/")
    again = tracking.runs_table_url(parent, uri="https://fed:secret@mlflow.example:5000/")
    exp = client.get_run(parent).info.experiment_id
    base, query = url.split("?")
    assert base == f"https://fed:***@mlflow.example:5000/#/experiments/{exp}/runs"
    q = parse_qs(query)
    assert q["workflowType"] == ["machine_learning"] and again == url
    tags = client.get_experiment(exp).tags
    state = json.loads(tags[f"mlflow.sharedViewState.{q['viewStateShareKey'][0]}"])
    assert state["searchFilter"] == f"tags.`mlflow.parentRunId` = '{parent}'"
    assert state["selectedColumns"] == [
        "metrics.`final_accuracy_pct`", "metrics.`mean_accuracy_last_L_pct`",
        "metrics.`last_rounds_L`", "metrics.`upload_mib`", "metrics.`download_mib`", "params.`federation.rounds`",
    ]  # fmt: skip
    assert sum(k.startswith("mlflow.sharedViewState.") for k in tags) == 1  # stored once
    assert tracking.run_url(exp, cell, "sqlite:///x.db") == (
        f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{cell}?workflowType=machine_learning"
    )
    # `fedapt run`'s last line on a database of one's own: `mlflow ui` on it, then the link
    from flows.cli.experiment import where_results
    from tasks.config import load_params

    p = load_params(REPO / "params.yaml", ["storage.bucket=null"])
    no_files = types.SimpleNamespace(train=None, test=None)  # (data read from no file)
    (line,) = [x for x in where_results(p, no_files, [{"mlflow_run_id": cell}]) if "MLflow" in x]
    assert line == (
        f"MLflow: {tracking.tracking_uri()} (see it with `mlflow ui --backend-store-uri "
        f"{tracking.tracking_uri()}`, then http://127.0.0.1:5000/#/experiments/{exp}/runs?"
        f"{query})"
    )
    for run_id in (cell, parent):
        tracking.end_run(run_id)


def test_a_cell_run_names_the_l_its_mean_accuracy_averaged(tmp_path, monkeypatch):
    """MLflow beside mean_accuracy_last_L: last_rounds_L, federation.last_rounds capped by the
    rounds evaluated (the L every report label names)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    from mlflow import MlflowClient

    from fedcore.events import History, RoundRecord
    from tasks.training.outputs import scores

    client = MlflowClient(tracking.tracking_uri())
    runs = []
    for rounds in (3, 7):
        run_id = client.create_run(client.create_experiment(f"e{rounds}")).info.run_id
        h = History(last_rounds=5)
        for r in range(1, rounds + 1):
            acc = 0.1 * r if r % 2 or r == rounds else None  # every other round evaluated
            h.rounds.append(RoundRecord(r, 0.1, (0,), 1, 1, r, r, 0.5, acc, 0.7, 0, 1.0))
        tracking.MlflowRounds(run_id).on_fit_end(h)
        tracking.log_final_metrics(run_id, h.to_dict())
        runs.append(client.get_run(run_id).data.metrics)
        # the same L in the records the run writes: the history's, metrics.json/summary.json's
        # (to_dict, summary_record) and scores.json's
        assert h.to_dict()["last_rounds_L"] == h.last_rounds_averaged == runs[-1]["last_rounds_L"]
        record = {**h.to_dict(), "rounds": rounds, "diverged_at_round": None}
        assert scores(record)["last_rounds_L"] == runs[-1]["last_rounds_L"]
    assert [m["last_rounds_L"] for m in runs] == [2, 4]  # evaluated: 1, 3 | 1, 3, 5, 7
    assert runs[0]["mean_accuracy_last_L_pct"] == pytest.approx(100 * (0.1 + 0.3) / 2)


def test_which_runs_register(tmp_path):
    """tracking.register: auto registers models evaluated on the whole test split that did
    not diverge; always and never mean what they say."""
    import types

    import numpy as np

    from tasks.config import load_params
    from tasks.training.registration import eval_set_sha256, registers

    class Split:
        labels = np.arange(10) % 3

        def __len__(self):
            return 10

    def data(rows):
        return types.SimpleNamespace(test=Split(), test_idx=rows)

    whole, part = data(np.arange(10)), data(np.arange(0, 10, 2))
    ok = {"final_accuracy": 0.8, "diverged_at_round": None}
    auto = load_params(None, [])
    assert registers(auto, whole, ok) and not registers(auto, part, ok)
    assert not registers(auto, whole, {**ok, "diverged_at_round": 3})
    always = load_params(None, ["tracking.register=always"])
    assert registers(always, part, ok)
    assert not registers(load_params(None, ["tracking.register=never"]), whole, ok)
    # A smoke run (fewer rounds or rows than its params file, a `dvc exp run`) moves no
    # alias under auto; always registers it.
    from tasks.results.origin import Origin

    smoke = Origin(entry="deployment", smoke=("federation.rounds 1 < 15 in the params file",))
    assert registers(auto, whole, ok, Origin()) and not registers(auto, whole, ok, smoke)
    assert registers(always, whole, ok, smoke)
    assert eval_set_sha256(auto, whole) != eval_set_sha256(auto, part)
    assert eval_set_sha256(auto, whole) == eval_set_sha256(auto, data(np.arange(10)))


def test_experiments_open_in_the_training_view_and_parent_runs_have_distinct_names(
    tmp_path, monkeypatch
):
    import datetime as dt

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    from mlflow import MlflowClient

    client = MlflowClient(tracking.tracking_uri())
    old = client.create_experiment("old")  # made before fedapt set the kind
    mine = client.create_experiment("mine", tags={tracking.EXPERIMENT_KIND_TAG: "finetuning"})
    run_id = tracking.start_experiment_run("new", {"a": 1})
    tracking.end_run(run_id)
    run = client.get_run(run_id)
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    # "new 2026-11-25 16:31:02": the experiment and the UTC time (no deployment outside Prefect)
    name, day, clock = run.info.run_name.split(" ")
    assert name == "new" and dt.datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S")
    tracking.end_run(tracking.start_experiment_run("old", {}))
    tracking.end_run(tracking.start_experiment_run("mine", {}))
    assert client.get_experiment(old).tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND
    assert client.get_experiment(mine).tags[tracking.EXPERIMENT_KIND_TAG] == "finetuning"
    when = dt.datetime(2026, 11, 25, 9, 5, 7, tzinfo=dt.UTC)
    assert tracking.parent_run_name("e", "nightly", when) == "e nightly 2026-11-25 09:05:07"
    assert tracking.parent_run_name("e", None, when) == "e 2026-11-25 09:05:07"
    # under a Prefect deployment (prefect.runtime.deployment.name; set the way Prefect's
    # runtime lets a test set it) the parent run carries the deployment's name
    monkeypatch.setenv("PREFECT__RUNTIME__DEPLOYMENT__NAME", "nightly")
    run_id = tracking.start_experiment_run("new", {})
    tracking.end_run(run_id)
    assert client.get_run(run_id).info.run_name.startswith("new nightly 20")
