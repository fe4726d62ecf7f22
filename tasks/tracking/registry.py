"""The MLflow model registry: each cell's merged model registered as a new version; the
best version of each registered model (by final accuracy on the same evaluation set) carries
the alias ``champion``, the newest ``challenger``."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from tasks.tracking import store

CHAMPION = "champion"
CHALLENGER = "challenger"  # the newest registered version, whether or not it beat the champion
EVAL_SET_TAG = "eval_set_sha256"


def registered_name(dataset: str, model: str, adapter: str) -> str:
    return f"fedapt-{dataset}-{model}-{adapter}".replace("_", "-")


def log_and_register_model(
    run_id: str,
    model: Any,
    example: Any,
    name: str,
    accuracy: float | None,
    tags: dict[str, str] | None = None,
) -> str:
    """Log the (merged) model to the run and register it as a new version of ``name``, tagged
    with its final accuracy and ``tags`` (the evaluation set's hash, the experiment, the git
    commit); it becomes ``challenger``, and ``champion`` if it beats the champion
    (:func:`update_champion`). Returns the version."""
    import mlflow
    import mlflow.pytorch
    import torch

    client = store.client()
    with (
        _registry_lock(name),
        _model_code() as code,
        _quiet_pickle_warning(),
        mlflow.start_run(run_id=run_id),
    ):
        # A pickled module, not MLflow 3's default ``pt2`` (a torch.export GraphModule whose
        # .eval() raises): ``load_model`` gives back the nn.Module itself. Its classes come
        # from fedapt's ``fedcore`` and ``models`` packages, logged beside it (``code_paths``:
        # MLflow puts them on sys.path when it loads the model).
        info = mlflow.pytorch.log_model(
            model.eval(),
            name="model",
            input_example=example.numpy(),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            registered_model_name=name,
            serialization_format="pickle",
            code_paths=code,
        )
    version = str(info.registered_model_version)  # MLflow returns an int here
    if accuracy is not None:  # in %, as every table and MLflow's metrics show it
        client.set_model_version_tag(name, version, ACCURACY_TAG, f"{100 * accuracy:.4f}")
    for key, value in (tags or {}).items():
        client.set_model_version_tag(name, version, key, value)
    with _registry_lock(name):  # compare-and-move: one run at a time per registered model
        client.set_registered_model_alias(name, CHALLENGER, version)
        update_champion(name, version)
    return version


MODEL_CODE = ("fedcore", "models")  # the packages a registered model's classes come from


@contextlib.contextmanager
def _model_code() -> Iterator[list[str]]:
    """Copies of :data:`MODEL_CODE` without their ``__pycache__`` (the ``code_paths``)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fedapt-model-code-") as tmp:
        paths = []
        for package in MODEL_CODE:
            dst = Path(tmp) / package
            shutil.copytree(store.ROOT / package, dst, ignore=shutil.ignore_patterns("__pycache__"))
            paths.append(str(dst))
        yield paths


class _PickleWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Pickle or CloudPickle" not in record.getMessage()


@contextlib.contextmanager
def _quiet_pickle_warning() -> Iterator[None]:
    """MLflow warns on every pickled model; fedapt pickles its own modules on purpose."""
    logger, flt = logging.getLogger("mlflow.pytorch"), _PickleWarning()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


@contextlib.contextmanager
def _registry_lock(name: str) -> Iterator[None]:
    """Serialise registrations of ``name`` on this machine: runs of different experiments
    register the same model (``fedapt-<dataset>-<model>-<adapter>``) at the same time, and
    the champion alias is read, compared and moved."""
    key = hashlib.sha256(f"{store.tracking_uri()}|{name}".encode()).hexdigest()[:16]
    with FileLock(Path(tempfile.gettempdir()) / f"fedapt-registry-{key}.lock"):
        yield  # blocks: a registration takes seconds


ACCURACY_TAG = "final_accuracy_pct"  # a version's final accuracy, in %
_FORMER_TAG = "final_accuracy"  # versions registered before: the same, in 0-1


def tagged_accuracy(tags: Mapping[str, str], missing: float) -> float:
    """A version's final accuracy in %, from its tag (or the 0-1 tag of versions registered
    before the unit was %); ``missing`` when it has neither."""
    if ACCURACY_TAG in tags:
        return float(tags[ACCURACY_TAG])
    if _FORMER_TAG in tags:
        return 100 * float(tags[_FORMER_TAG])
    return missing


def update_champion(name: str, candidate: str) -> str | None:
    """Move ``champion`` to version ``candidate`` when it beats the champion: a higher final
    accuracy on the same evaluation set (the ``eval_set_sha256`` tags are equal). A champion
    on another evaluation set stays (accuracies on different test sets do not compare; promote
    by hand if you mean it); one without the tag (registered before this rule) is compared by
    accuracy alone. Without a champion, a candidate with an accuracy becomes it. Returns the
    champion's version afterwards (None: there is none)."""
    from mlflow.exceptions import MlflowException

    client = store.client()
    new = client.get_model_version(name, candidate)
    acc = tagged_accuracy(new.tags, float("nan"))
    try:
        champ = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # no champion yet
        champ = None
    if champ is not None:
        same = champ.tags.get(EVAL_SET_TAG) in (None, new.tags.get(EVAL_SET_TAG))
        if not (same and acc > tagged_accuracy(champ.tags, float("-inf"))):
            return str(champ.version)
    elif acc != acc:  # never evaluated: not a champion
        return None
    client.set_registered_model_alias(name, CHAMPION, str(candidate))
    return str(candidate)
