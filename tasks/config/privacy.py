"""The ``privacy`` section: client-level DP-FedAvg (McMahan et al. 2018) and its accountant.

null (the default): no privacy mechanism. ``--set privacy.<key>=...`` starts the section from
its defaults. The engine's side is ``fedcore.privacy.server``; what each key means and the
algorithms it refuses are in docs/privacy.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.config.base import Section


class AdaptiveClipSection(Section):
    """Adaptive clipping (Andrew et al. 2021): C follows a noisy quantile of the update norms,
    starting from privacy.clip."""

    target_quantile: float = Field(0.5, ge=0.0, le=1.0)  # gamma
    learning_rate: float = Field(0.2, gt=0.0)  # eta_C
    # sigma_b, the clip count's noise; null: the paper's expected cohort / 20
    count_stddev: float | None = Field(None, gt=0.0)


class PrivacySection(Section):
    # C: each client's update (its delta from the global model, over the trained entries it
    # uploads) is scaled to at most this L2 norm; with adaptive_clip, C in round 1
    clip: float = Field(1.0, gt=0.0)
    # z: the server adds N(0, (z C)^2) to the sum of the clipped updates; null: calibrated
    # from target_epsilon (the least z whose epsilon after federation.rounds meets it)
    noise_multiplier: float | None = Field(None, ge=0.0)
    # with noise_multiplier given as well: a budget (the run stops before the round that
    # would spend more)
    target_epsilon: float | None = Field(None, gt=0.0)
    delta: float = Field(1e-5, gt=0.0, lt=1.0)  # must also be < 1 / partition.num_clients
    accountant: Literal["rdp", "pld"] = "rdp"  # dp-accounting's RDP or PLD accountant
    adaptive_clip: AdaptiveClipSection | None = None

    @model_validator(mode="after")
    def _noise_given(self) -> PrivacySection:
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError(
                "give noise_multiplier (the noise std over the clip norm), target_epsilon (z "
                "is then calibrated to it), or both (a budget)"
            )
        return self
