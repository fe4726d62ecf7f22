"""MLflow: the only package that talks to it, cut by job.

- :mod:`~tasks.tracking.store`: where runs go (the tracking URI, the client) and whether
  fedapt can use that store;
- :mod:`~tasks.tracking.runs`: one parent run per experiment, one child run per cell with
  ``step = round`` metrics, and their end state however the process ends;
- :mod:`~tasks.tracking.registry`: each cell's merged model registered; the ``champion`` and
  ``challenger`` aliases;
- :mod:`~tasks.tracking.views`: links into the UI that open the training view's Runs table
  of an experiment run's cells, with their results as columns.

The names below are the package's interface (``from tasks import tracking``).
"""

from tasks.tracking.registry import (
    CHALLENGER,
    CHAMPION,
    EVAL_SET_TAG,
    log_and_register_model,
    registered_name,
    update_champion,
)
from tasks.tracking.runs import (
    MlflowRounds,
    close_stale_runs,
    end_active_runs,
    end_run,
    ended_on_error,
    log_artifacts,
    log_final_metrics,
    log_metrics,
    parent_run_name,
    percent_named,
    provenance_tags,
    start_cell_run,
    start_experiment_run,
)
from tasks.tracking.store import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    check_tracking_server,
    client,
    experiment_id,
    tracking_uri,
)
from tasks.tracking.views import parent_run, run_url, runs_table_url

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "EVAL_SET_TAG",
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "MlflowRounds",
    "check_tracking_server",
    "client",
    "close_stale_runs",
    "end_active_runs",
    "end_run",
    "ended_on_error",
    "experiment_id",
    "log_and_register_model",
    "log_artifacts",
    "log_final_metrics",
    "log_metrics",
    "parent_run",
    "parent_run_name",
    "percent_named",
    "provenance_tags",
    "registered_name",
    "run_url",
    "runs_table_url",
    "start_cell_run",
    "start_experiment_run",
    "tracking_uri",
    "update_champion",
]
