"""What the tests of tasks/ share: a training cell's params on the repository's data (its
checkpoint every round) and the tiny Shakespeare federation's settings."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 4


def cell_params(tmp_path: Path, *extra: str):
    from tasks.config import load_params

    return load_params(
        REPO / "params.yaml",
        [
            f"experiment.reports_dir={tmp_path / 'reports'}",
            f"data.root={REPO / 'data/raw'}",
            "data.train_subset=300",
            "data.test_subset=100",
            "partition.num_clients=4",
            "partition.dirichlet_classwise.min_size=5",
            "validation.min_shard_size=5",
            f"federation.rounds={ROUNDS}",
            "federation.participation=0.5",
            "client.max_steps=3",
            "runtime.workers=0",
            "runtime.tracking=false",
            "runtime.checkpoint_every=1",
            "storage.bucket=null",
            *extra,
        ],
    )


# the tiny Shakespeare federation (tests/tasks/training/test_shakespeare_run.py)
TINY = "{vocab_size: 512, layers: 1, hidden: 16, heads: 2, context: 8, stride: 8}"
SETS = [
    "data.dataset=shakespeare",
    "data.train_subset=null",
    "data.test_subset=300",
    "model.name=gpt2_small",
    f"model.options={TINY}",
    "partition.scheme=natural",
    "partition.num_clients=3",
    "federation.rounds=1",
    "client.max_steps=2",
    "client.batch_size=8",
    "client.optimizer=adamw",
    "client.lr=0.003",
    "runtime.workers=0",
    "runtime.tracking=false",
    "pretrain.max_samples=64",
    "pretrain.epochs=1",
    "pretrain.lr=0.003",
    "pretrain.batch_size=16",
]
