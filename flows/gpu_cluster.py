"""A Dask LocalCluster with one GPU per worker process (``runtime.task_runner: dask`` on a
machine with GPUs; imported by name, so ``distributed`` loads only when such a cluster starts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distributed import LocalCluster


class GPUCluster(LocalCluster):
    """A LocalCluster whose worker ``i`` sees GPU ``gpus[i % len(gpus)]`` alone (its nanny
    starts it with that ``CUDA_VISIBLE_DEVICES``), so ``dask_workers`` equal to the number of
    GPUs trains one cell per GPU. (dask-cuda's LocalCUDACluster does the same; its releases
    for this Dask pin RAPIDS' own Dask builds, and the one pip resolves here is from 2021.)"""

    def __init__(self, *, gpus: Sequence[str], n_workers: int = 1, **kwargs: Any) -> None:
        if not gpus:
            raise ValueError("GPUCluster needs at least one GPU")
        self.gpus = list(gpus)
        super().__init__(n_workers=0, **kwargs)
        self.scale(n_workers)

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        ((name, spec),) = super().new_worker_spec().items()
        options = dict(spec.get("options", {}))
        env = {**options.get("env", {}), "CUDA_VISIBLE_DEVICES": self.gpus[name % len(self.gpus)]}
        return {name: {**spec, "options": {**options, "env": env}}}
