"""Seeded, pure partitioners: labels -> one sorted int64 index array per client.

Each scheme draws only from ``numpy.random.default_rng(seed)``: the same labels, num_clients,
seed and options give the same content hash and byte-identical manifests.

The two Dirichlet schemes are different experiments and are named apart:

* ``dirichlet_classwise`` splits each *class* over the clients: p_k ~ Dir_N(beta) is the
  share of class k that each of the N clients gets (NIID-Bench ``noniid-labeldir``, Li et al.
  2021; the seeds' Dir(beta), seed 000 §IV, and FedML's LDA Dir(0.3), seed 004 §6.1.3).
  Client sizes are an outcome, not a parameter: small beta gives very unequal clients.
* ``dirichlet_clientwise`` lets each *client* draw its class mix q_i ~ Dir(alpha p), p the
  global class prior (Hsu et al. 2019, seed 002 §4), and sets client sizes separately (equal,
  normal or Dirichlet). Shares within a class are not controlled: a popular class is shared
  by whichever clients want it, while a client's size is fixed in advance.

Feature skew (``gaussian_noise``, seed 000 §IV) is a per-client noise variance, applied by
``fedcore.client``.

A dataset with natural clients (Shakespeare's speaking roles) gives each sample a ``group``;
``natural`` puts each group on a client of its own (the other schemes ignore groups).

A scheme's options are its keyword-only parameters, their annotations the allowed values
(``beta: Annotated[Float, Gt(0)] = 0.5``); ``core.scheme`` derives ``<scheme>.Options``
from them and wraps the scheme so that options, given directly or through
:func:`make_partition`, pass :func:`fedcore.options.parse`. Only data-dependent bounds
(``min_size <= n // num_clients``, ``m <=`` the number of classes) are checked in the scheme.

By job: ``core`` (the :class:`Partition` type, the checks every scheme shares and client
sizes, the ``scheme`` wrapper), ``schemes`` (the schemes themselves) and ``registry`` (the
table ``PARTITIONERS`` of them, each scheme's options type, :func:`make_partition`).
"""

from __future__ import annotations

from fedcore.partition.core import MANIFEST_HEADER, Partition, as_labels, check, client_sizes
from fedcore.partition.registry import PARTITIONERS, make_partition, scheme_options_type
from fedcore.partition.schemes import dirichlet_classwise, iid

__all__ = [
    "MANIFEST_HEADER",
    "PARTITIONERS",
    "Partition",
    "as_labels",
    "check",
    "client_sizes",
    "dirichlet_classwise",
    "iid",
    "make_partition",
    "scheme_options_type",
]
