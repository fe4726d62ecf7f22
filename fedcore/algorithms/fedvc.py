"""FedVC (Hsu et al. 2020; seed 002 §3.1): virtual clients of a fixed size N_VC.

Each round a selected client trains on exactly N_VC of its samples, drawn without
replacement when n_k >= N_VC and with replacement otherwise, so every update costs the
same number of local steps however large the client. To keep the samples of large clients
from going unused, clients are selected with probability proportional to n_k. Every update
then carries N_VC samples: the average is unweighted, as between equal virtual clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from annotated_types import Ge

from fedcore.algorithms.base import FederatedAlgorithm
from fedcore.options import Int
from fedcore.sampling import (
    VIRTUAL_CLIENT_STREAM,
    SamplingConfig,
    derive_seed,
    sample_clients_by_size,
)


@dataclass(frozen=True)
class FedVC(FederatedAlgorithm):
    name: ClassVar[str] = "fedvc"
    private_refusal: ClassVar[str | None] = (
        "it samples clients in proportion to their data size, not uniformly as the accountant assumes"
    )

    n_vc: Annotated[Int, Ge(1)] = 256  # N_VC; seed 002 gives no value, tune it to the shards

    def select_clients(
        self, cfg: SamplingConfig, shard_sizes: Sequence[int], round_: int
    ) -> tuple[int, ...]:
        return sample_clients_by_size(cfg, shard_sizes, round_)

    def client_indices(
        self, shard: np.ndarray, round_: int, client_id: int, slot: int, seed: int
    ) -> np.ndarray:
        rng = np.random.default_rng(
            derive_seed(seed, VIRTUAL_CLIENT_STREAM, round_, client_id, slot)
        )
        pos = rng.choice(len(shard), size=self.n_vc, replace=len(shard) < self.n_vc)
        return shard[pos]
