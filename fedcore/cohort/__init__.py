"""Cohort execution: the clients of a round train together, one batched computation per step.

The sequential engine (``fedcore.engine`` with ``engine="sequential"``) trains one client at a
time; it stays the reference. Here the clients of a round (a *cohort*) train at once:

* every client's trainable parameters, changing buffers (BatchNorm running statistics) and
  optimiser state are stacked along a leading client dimension;
* one local step of all clients is one call of ``torch.func.vmap`` over
  ``grad(functional_call(model, ...))``: each client sees exactly its own batch, drawn from its
  own generator in its own order (``fedcore.client.batch_order``), with its own objective;
* frozen parameters are *not* stacked: every client holds the same values (the global model it
  downloaded), so vmap runs a frozen layer once over all clients' samples as one large batch and
  never computes its weight gradient (the shared frozen base of adapter methods);
* ragged clients are grouped, never padded: at step ``s`` the clients still training are
  grouped by batch size, input shape and early exit, and each group is one vmapped call. A
  client with fewer steps simply stops; a short last batch trains with its own size. What a
  client computes is what it computes in ``fedcore.client.train_locally``.

The SGD and AdamW updates are the arithmetic of ``torch.optim.sgd``/``torch.optim.adam``
(single-tensor path) applied to the stacked tensors, element by element. A parameter that gets
no gradient in a step (an early exit's unused head) is skipped for the clients of that step,
as ``torch.optim`` skips a parameter whose ``.grad`` is None: no weight decay, no momentum.

Which parameters a step uses, and which buffers it changes, is found once per step shape by a
probe (one client's step with ``torch.autograd``), and cached.

Hand-written: no FL framework vectorises clients (Flower, FedML, pfl-research and FedScale run
them one after another or one per process); ``torch.func`` supplies the batching.
"""

from fedcore.cohort.features import FEATURE_CACHE_SHARE, FeatureCache, FeatureCaches
from fedcore.cohort.plan import (
    ENGINES,
    CohortClient,
    check_batchable,
    resolve_engine,
    shared_objective,
)
from fedcore.cohort.trainer import CohortTrainer
from fedcore.cohort.util import activation_bytes, available_memory

__all__ = [
    "ENGINES",
    "FEATURE_CACHE_SHARE",
    "CohortClient",
    "CohortTrainer",
    "FeatureCache",
    "FeatureCaches",
    "activation_bytes",
    "available_memory",
    "check_batchable",
    "resolve_engine",
    "shared_objective",
]
