"""The claims ``fedapt reproduce`` tests, in report order, and their lookups.

To add a claim: a module beside these with its experiments (the seed's protocol as ``--set``
overrides, plus the ``cpu`` and ``ci`` scale), a pure ``judge`` and a ``plot``, then its
``CLAIM`` in ``CLAIMS`` below. A claim that needs something this build may lack names it in
``requires`` and is reported as not available until it exists (``ANYTIME_PA`` below names
the parallel-adapter exit methods of seed 001 Table 2's "+ PA" rows; the Shakespeare
next-word claim names ``dataset:shakespeare`` and ``model:gpt2_small``).
"""

from __future__ import annotations

from functools import partial

from fedcore.errors import UnknownNameError
from tasks.reproduce import (
    claim_adapters,
    claim_anytime,
    claim_cross_device,
    claim_dirichlet_alpha,
    claim_fedir,
    claim_fednilo,
    claim_fednilo_iid,
    claim_fedvc,
    claim_gaussian_noise,
    claim_label_skew,
    claim_label_skew_m2,
    claim_local_epochs,
    claim_multitier,
    claim_personalize,
    claim_server_opt,
    claim_shakespeare,
    claim_train_time,
    claim_transformer,
)
from tasks.reproduce.spec import PROFILES, Claim, Experiment

# Seed 001 Table 2's "+ PA" rows: the same anytime comparison with parallel adapters in the
# FFNs (models/adapters/exits_pa.py, bottleneck 64 as in the seed).
ANYTIME_PA = Claim(
    id="anytime-pa",
    title="With parallel adapters (+ PA) the Accumulator is still at least as accurate as "
    "layer-wise linear heads at every exit.",
    source='seed 001 Table 2, "+ PA" rows',
    paper="Table 2, CIFAR-100 Non-IID (1.0): L.W. Linear + PA 47.94 ± 1.53 vs Accumulator + "
    "PA 64.28 ± 1.84.",
    experiments=(
        Experiment(
            "anytime-exits-pa",
            protocol=(
                *claim_anytime.EXITS.protocol,
                "grid.adapters=[lw_linear_pa,accumulator_pa]",
                "grid.adapter_options.lw_linear_pa.exits=anytime",
                "grid.adapter_options.accumulator_pa.exits=anytime",
            ),
            scale=claim_anytime.EXITS.scale,
            tune=claim_anytime.EXITS.tune,
        ),
    ),
    measure=partial(
        claim_anytime.measure,
        experiment="anytime-exits-pa",
        linear="fedavg-lw_linear_pa",
        accumulator="fedavg-accumulator_pa",
    ),
    rule=claim_anytime.RULE.replace(
        "the Accumulator minus the layer-wise linear heads",
        "the Accumulator + PA minus the layer-wise linear heads + PA",
    ).replace("the linear heads' last exit", "the linear heads' (+ PA) last exit"),
    tolerance=claim_anytime.TOLERANCE_TEXT,
    plot=partial(
        claim_anytime.plot,
        experiment="anytime-exits-pa",
        linear="fedavg-lw_linear_pa",
        accumulator="fedavg-accumulator_pa",
    ),
    scaled=claim_anytime.CLAIM.scaled,
    thresholds=claim_anytime.THRESHOLDS,
    window=claim_anytime.WINDOW,
    dropped=(claim_anytime.IN_DOMAIN,),
    requires=("adapter:lw_linear_pa", "adapter:accumulator_pa"),
)

CLAIMS: tuple[Claim, ...] = (
    claim_adapters.CLAIM,
    claim_label_skew.CLAIM,
    claim_fednilo.CLAIM,
    claim_server_opt.CLAIM,
    claim_transformer.CLAIM,
    claim_anytime.CLAIM,
    claim_train_time.CLAIM,
    ANYTIME_PA,
    claim_cross_device.CLAIM,
    claim_label_skew_m2.CLAIM,
    claim_gaussian_noise.CLAIM,
    claim_shakespeare.CLAIM,
    claim_local_epochs.CLAIM,
    claim_dirichlet_alpha.CLAIM,
    claim_fedir.CLAIM,
    claim_fedvc.CLAIM,
    claim_fednilo_iid.CLAIM,
    claim_multitier.CLAIM,
    claim_personalize.CLAIM,
)


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise UnknownNameError("profile (--profile)", profile, PROFILES)
    return profile


def unmet(claim: Claim) -> list[str]:
    """The registry entries ``claim.requires`` names that this build does not have."""
    from fedcore.algorithms import ALGORITHMS
    from fedcore.datasets import list_datasets
    from models.adapters import ADAPTER_METHODS
    from models.registry import list_models

    known = {
        "adapter": set(ADAPTER_METHODS),
        "algorithm": set(ALGORITHMS),
        "dataset": set(list_datasets()),
        "model": set(list_models()),
    }
    out = []
    for req in claim.requires:
        kind, _, name = req.partition(":")
        if name not in known.get(kind, set()):
            out.append(req)
    return out


def select(ids: list[str] | None = None) -> tuple[Claim, ...]:
    """The claims named by ``ids`` (all when None), in report order."""
    if not ids:
        return CLAIMS
    by_id = {c.id: c for c in CLAIMS}
    for i in ids:
        if i not in by_id:
            raise UnknownNameError("claim (--claim)", i, list(by_id))
    return tuple(c for c in CLAIMS if c.id in ids)
