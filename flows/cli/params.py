"""The params of a command: the ``--params``/``--set`` options and loading them typed, numerics
in force, the keys that become paths registered for the error line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

ParamsOpt = Annotated[
    Path | None, typer.Option("--params", "-p", help="params file (default: params.yaml)")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="override a parameter, e.g. --set federation.rounds=5"),
]


def load(
    params: Path | None,
    overrides: list[str] | None,
    extra: list[str] | None = None,
    *,
    numerics: str = "native",
    options: dict[str, str] | None = None,
) -> Any:
    """The typed params, their numerics in force (``numerics``: what ``runtime.numerics:
    auto`` means for this command; the DVC stages and ``fedapt reproduce`` say portable).
    ``options``: the overrides that a command's own options make, each with the option's
    name (``{"runtime.device=tpu": "--device"}``): a bad value is refused naming the option
    the user typed, not the params key and the file."""
    from fedcore.errors import ConfigError
    from tasks.config import in_force, load_params

    given = [*(overrides or []), *(extra or [])]
    if options:
        load_params(params, given)  # the file's and --set's own errors first, as they are
        for item, option in options.items():
            try:
                load_params(params, [*given, item])
            except ConfigError as exc:
                _, named, problem = str(exc).partition(f"{item.split('=', 1)[0]}: ")
                raise ConfigError(f"{option}: {problem}" if named else str(exc)) from None
    p = load_params(params, [*given, *(options or {})])
    _setting_paths(p)
    # Before anything computes: ATen and MKL fix their kernels at their first call.
    return in_force(p, numerics)


def _setting_paths(p: Any) -> None:
    """The params keys that become paths, for ``guard``'s one line (``flows.settings``)."""
    from flows.settings import setting_path
    from tasks.config import experiment_dir

    reports = p.experiment.reports_dir
    setting_path(
        "experiment.reports_dir",
        reports,
        experiment_dir(p),
        "a folder fedapt may create and write into, e.g. reports (the experiment's folder "
        f"{p.experiment.name} goes in it)",
    )
    setting_path(
        "data.root",
        p.data.root,
        p.data.root,
        "a folder holding the dataset's files, or one fedapt may create and download into, "
        "e.g. data/raw",
    )


def output_path(option: str, path: Path, *, file: str | None = None) -> Path:
    """The path an output option names, checked before any work: a folder fedapt may create
    and write into (``file``: the file of that name in such a folder, not a folder itself).
    A refusal, now or from the OS later, is one line naming the option."""
    from fedcore.errors import ConfigError
    from flows.settings import setting_path
    from tasks.io import check_writable

    if file is not None:
        if path.is_dir():
            raise ConfigError(
                f"{option} {path} is a folder; give the file to write, e.g. {path / file}"
            )
        check_writable(option, path.parent)
        allowed = f"a file fedapt may write, e.g. {file}"
    else:
        check_writable(option, path)
        allowed = "a folder fedapt may create and write into"
    setting_path(option, str(path), path, allowed)
    return path
