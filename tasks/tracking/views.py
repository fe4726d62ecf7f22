"""Links into MLflow's UI that open what a fedapt user compares: the training view's Runs
table of one experiment run's cells, with their results as columns.

MLflow 3.17's UI decides its view (GenAI or model training) from the URL's ``workflowType``,
else from the browser's ``localStorage`` (default: GenAI), whatever the experiment's
``mlflow.experimentKind`` tag; and it shows no metric column until the user ticks one. Both
are set here with MLflow's own URL state, nothing patched:

- ``workflowType=machine_learning`` in the link: the training view;
- ``viewStateShareKey=<key>``: the UI's *shared view* ("Share" in the Runs table), read from
  the experiment tag ``mlflow.sharedViewState.<key>`` (JSON): a search filter on the parent
  run (its cells, one row each: a filter and a sort by a metric turn the table's nesting
  off, so no row stays collapsed), sorted by final accuracy, and the columns below. The UI
  leaves ``runsExpanded`` out of a shared view, so the cells are listed, not a parent
  expanded.

Links never carry a password (``fedcore.errors.mask_credentials``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from tasks.tracking import store

WORKFLOW_TYPE = "machine_learning"  # the UI's WorkflowType.MACHINE_LEARNING (training view)
SHARED_VIEW_TAG = "mlflow.sharedViewState."  # + key: an experiment tag, the view's JSON
PARENT_TAG = "mlflow.parentRunId"
# What the Runs table shows for each cell (the UI's column keys: `<group>.`<name>``), in order
RESULT_METRICS = (
    "final_accuracy_pct",
    "mean_accuracy_last_L_pct",
    "last_rounds_L",  # the L that mean averaged (capped by the rounds evaluated)
    "upload_mib",
    "download_mib",
)
RESULT_PARAMS = ("federation.rounds",)
COLUMNS = (
    *(f"metrics.`{m}`" for m in RESULT_METRICS),
    *(f"params.`{p}`" for p in RESULT_PARAMS),
)
UI_PORT = 5000  # `mlflow ui`'s default port (a local store has no server of its own)


def ui_base(uri: str | None = None) -> str:
    """The UI's address for the tracking URI in use: the server itself, or (a local store)
    where ``mlflow ui`` serves it by default. Its password masked."""
    from fedcore.errors import mask_credentials

    uri = uri or store.tracking_uri()
    if uri.startswith(("http://", "https://")):
        return mask_credentials(uri).rstrip("/")
    return f"http://127.0.0.1:{UI_PORT}"


def home_url(uri: str | None = None) -> str:
    """The UI's experiments list in the training view (what `fedapt up` prints): MLflow's
    own root opens in the GenAI view in a fresh browser."""
    return f"{ui_base(uri)}/#/experiments?{urlencode({'workflowType': WORKFLOW_TYPE})}"


def run_url(experiment_id: str, run_id: str, uri: str | None = None) -> str:
    """A run's page, in the training view."""
    query = urlencode({"workflowType": WORKFLOW_TYPE})
    return f"{ui_base(uri)}/#/experiments/{experiment_id}/runs/{run_id}?{query}"


def view_state(parent_run_id: str) -> dict[str, Any]:
    """The shared view of one experiment run: its cells, best final accuracy first, with the
    result columns (the keys of the UI's search facets and UI state)."""
    return {
        "searchFilter": f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        "orderByKey": f"metrics.`{RESULT_METRICS[0]}`",
        "orderByAsc": False,
        "selectedColumns": list(COLUMNS),
        "columnOrder": list(COLUMNS),
    }


def share_key(state: Mapping[str, Any]) -> str:
    """The view's key: a hash of its JSON (the same view, the same key and tag)."""
    return "fedapt-" + hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def runs_table_url(parent_run_id: str, client: Any = None, uri: str | None = None) -> str:
    """The Runs table of the experiment run ``parent_run_id``, training view, one row per
    cell with the result columns. Stores the view as an experiment tag (once)."""
    client = client or store.client()
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    state = view_state(parent_run_id)
    key = share_key(state)
    tags = client.get_experiment(experiment_id).tags
    if SHARED_VIEW_TAG + key not in tags:
        client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + key, json.dumps(state))
    query = urlencode({"workflowType": WORKFLOW_TYPE, "viewStateShareKey": key})
    return f"{ui_base(uri)}/#/experiments/{experiment_id}/runs?{query}"


def parent_run(records: Sequence[Mapping[str, Any]], client: Any = None) -> str | None:
    """The experiment run whose children the cells' MLflow runs (``mlflow_run_id``) are;
    None when no cell was tracked or a cell has no parent (a DVC stage's run)."""
    ids = [r["mlflow_run_id"] for r in records if r.get("mlflow_run_id")]
    if not ids:
        return None
    client = client or store.client()
    parent: str | None = client.get_run(ids[0]).data.tags.get(PARENT_TAG)
    return parent
