"""The experiment pipeline: partition -> one training run per grid cell -> summary.

Every input is checked before anything is written, so bad parameters leave no partial
outputs; each output file is written atomically.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from fedcore.algorithms import build_algorithm
from fedcore.device import resolve_device
from fedcore.errors import ConfigError
from fedcore.partition import list_partitioners, scheme_options
from models.adapters import check_adapter
from tasks.config import Params
from tasks.data import build_partition, load_experiment_data, load_partition, write_partition
from tasks.io import atomic_write_json
from tasks.progress import RichProgress
from tasks.train import cell_name, model_factory, train_cell


def experiment_dir(params: Params) -> Path:
    return Path(params.experiment.reports_dir) / params.experiment.name


def validate(params: Params) -> None:
    """Fail on bad names/options before any data is loaded or any file written."""
    for algorithm in params.grid.algorithms:
        build_algorithm(algorithm, **params.grid.algorithm_options.get(algorithm, {}))
    for adapter in params.grid.adapters:
        check_adapter(adapter)
    resolve_device(params.runtime.device)
    scheme_options(params.partition.scheme)  # unknown scheme -> the valid names
    for section in params.partition.option_sections:
        if section not in list_partitioners():
            raise ConfigError(
                f"unknown key 'partition.{section}'; option sections are scheme names: "
                + ", ".join(list_partitioners())
            )


def run_experiment(
    params: Params, console: Console | None = None, partition_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Partition (or read the manifest in ``partition_dir``), train every cell, summarise."""
    console = console or Console(stderr=True)
    validate(params)
    data = load_experiment_data(params)
    model_factory(params, data)()  # unknown model or option -> error before any output
    out = experiment_dir(params)
    if partition_dir is not None:
        part = load_partition(partition_dir)
        want = (params.partition.scheme, params.partition.num_clients)
        if (part.scheme, part.num_clients) != want:
            raise ConfigError(
                f"partition in {partition_dir} is {part.scheme} over {part.num_clients} clients, "
                f"params.yaml asks for {want[0]} over {want[1]}; re-run fedapt partition"
            )
    else:
        part = build_partition(params, data)
        write_partition(params, data, part, out / "partition")
    records = []
    for algorithm in params.grid.algorithms:
        for adapter in params.grid.adapters:
            name = cell_name(algorithm, adapter)
            started = time.perf_counter()
            rec = train_cell(
                params,
                data,
                part,
                algorithm,
                adapter,
                out / "runs" / name,
                callbacks=[RichProgress(name, console)],
            )
            rec["process_seconds"] = round(time.perf_counter() - started, 3)
            records.append(rec)
    atomic_write_json(
        out / "summary.json",
        {"experiment": params.experiment.name, "params": params.flat(), "runs": records},
    )
    return records
