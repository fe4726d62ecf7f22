"""Client-level DP for federated updates: clipping, Gaussian noise, adaptive clipping.

Hand-written: the maintained DP libraries ship accountants (dp-accounting) or per-example
DP-SGD for one model (Opacus), not the per-client pieces of DP-FedAvg over a dict of update
tensors, so these few pure functions are fedapt's own, each tied to its paper:

- DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent Language
  Models", Alg. 1 with uniform weights): each client's update is clipped to global L2 norm C
  (scale min(1, C / norm)); the server adds N(0, (z C)^2) to the *sum* of the clipped updates
  and divides by the expected cohort size (fixed: the denominator must not depend on who
  reported, or it would leak). ``z`` is what the accountant accounts.
- Adaptive clipping (Andrew et al. 2021, "Differentially Private Learning with Adaptive
  Clipping"): C follows a noisy estimate of the gamma-quantile of the update
  norms, C <- C exp(-eta_C (b~ - gamma)), b~ the noisy fraction of clients with norm <= C; the
  count query has its own noise sigma_b and the noise multiplier z is split so that the two
  queries together spend what z alone would: z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2).
- Local DP: each client adds N(0, (z_local C)^2) to its own clipped update before sending it.

The functions act on the entries they are given (for an adapter: its trained entries only),
keep each entry's dtype (float32 or float64) and device, and never edit the caller's tensors.
Noise is drawn, entry by entry, from a CPU ``torch.Generator`` whose seed is a hash of (run
seed, round, tag, client, entry name): the same bytes whatever the order of clients or entries,
the worker count or the engine.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedcore.errors import ConfigError

Update = Mapping[str, torch.Tensor]

CENTRAL = "central"  # the server's noise on the sum
LOCAL = "local"  # a client's own noise
CLIP_COUNT = "clip-count"  # adaptive clipping's noise on the count


def noise_seed(seed: int, round_: int, tag: str, client: int = -1, entry: str = "") -> int:
    """A 63-bit seed from (run seed, round, tag, client, entry): SHA-256, so streams of
    different tags, clients or entries are unrelated and none depends on draw order."""
    text = f"fedapt/privacy/{tag}/{seed}/{round_}/{client}/{entry}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def check_clip(clip_norm: object, key: str = "privacy.clip") -> None:
    if not _positive(clip_norm):
        raise ConfigError(f"{key} must be a finite number > 0 (got {clip_norm!r})")


def check_noise_multiplier(z: object, key: str = "privacy.noise_multiplier") -> None:
    if not _finite(z) or z < 0:  # type: ignore[operator]
        raise ConfigError(f"{key} must be a finite number >= 0 (got {z!r})")


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x: object) -> bool:
    return _finite(x) and x > 0  # type: ignore[operator]


# --- clipping ---------------------------------------------------------------------------------


def global_norm(update: Update) -> float:
    """The L2 norm of all entries together, accumulated in float64 in entry-name order."""
    total = 0.0
    for name in sorted(update):
        total += float(update[name].detach().to(torch.float64).square().sum())
    return math.sqrt(total)


def clip_update(update: Update, clip_norm: float) -> tuple[dict[str, torch.Tensor], float]:
    """(the update scaled by min(1, C / norm), its norm before clipping); new tensors."""
    check_clip(clip_norm)
    norm = global_norm(update)
    scale = 1.0 if norm <= clip_norm else clip_norm / norm
    return {name: t.detach() * scale for name, t in update.items()}, norm


# --- Gaussian noise -----------------------------------------------------------------------------


def gaussian_noise(
    like: Update, std: float, *, seed: int, round_: int, tag: str, client: int = -1
) -> dict[str, torch.Tensor]:
    """N(0, std^2) per element, shaped, typed and placed like ``like``'s entries."""
    out = {}
    for name, t in like.items():
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"DP noise needs float32 or float64 entries ({name} is {t.dtype})")
        g = torch.Generator().manual_seed(noise_seed(seed, round_, tag, client, name))
        z = torch.randn(t.shape, generator=g, dtype=t.dtype)
        out[name] = (z * std).to(t.device)
    return out


def add_local_noise(
    clipped: Update, *, noise_multiplier: float, clip_norm: float, seed: int, round_: int,
    client: int,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Local DP: the client's clipped update plus N(0, (z_local C)^2) of its own stream."""
    check_noise_multiplier(noise_multiplier, "privacy.local_noise_multiplier")
    check_clip(clip_norm)
    noise = gaussian_noise(
        clipped, noise_multiplier * clip_norm, seed=seed, round_=round_, tag=LOCAL, client=client
    )
    return {name: t.detach() + noise[name] for name, t in clipped.items()}


def sum_updates(updates: Mapping[int, Update]) -> dict[str, torch.Tensor]:
    """The entry-wise sum over clients, accumulated in float64 in client-id order (as
    ``fedcore.aggregate`` does: the same bits whatever order the updates arrived in), returned
    in each entry's dtype."""
    if not updates:
        raise ValueError("sum_updates needs at least one update")
    ids = sorted(updates)
    first = updates[ids[0]]
    total = {name: t.detach().to(torch.float64, copy=True) for name, t in first.items()}
    for cid in ids[1:]:
        if updates[cid].keys() != total.keys():
            raise ValueError(f"client {cid}'s update has other entries than client {ids[0]}'s")
        for name in total:
            total[name] += updates[cid][name].detach().to(torch.float64)
    return {name: total[name].to(first[name].dtype) for name in total}


def noisy_mean(
    clipped_sum: Update, *, noise_multiplier: float, clip_norm: float, expected_cohort: float,
    seed: int, round_: int,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """DP-FedAvg's server step: (sum + N(0, (z C)^2)) / expected cohort size."""
    check_noise_multiplier(noise_multiplier)
    check_clip(clip_norm)
    if not _positive(expected_cohort):
        raise ConfigError(f"the expected cohort size must be > 0 (got {expected_cohort!r})")
    noise = gaussian_noise(
        clipped_sum, noise_multiplier * clip_norm, seed=seed, round_=round_, tag=CENTRAL
    )
    return {name: (t.detach() + noise[name]) / expected_cohort for name, t in clipped_sum.items()}


@dataclass(frozen=True)
class DpRound:
    """What one DP-FedAvg round computed (for the round records)."""

    mean: dict[str, torch.Tensor]
    norms: dict[int, float]  # each client's update norm before clipping
    clipped: int  # how many clients were scaled down


def dp_fedavg(
    updates: Mapping[int, Update], *, clip_norm: float, noise_multiplier: float,
    expected_cohort: float, seed: int, round_: int,
) -> DpRound:  # fmt: skip
    """Clip each client's update (client id -> entries), sum, add central noise, divide by the
    expected cohort size (McMahan et al. 2018, Alg. 1, uniform weights)."""
    clipped, norms = {}, {}
    for cid in sorted(updates):
        clipped[cid], norms[cid] = clip_update(updates[cid], clip_norm)
    mean = noisy_mean(
        sum_updates(clipped),
        noise_multiplier=noise_multiplier,
        clip_norm=clip_norm,
        expected_cohort=expected_cohort,
        seed=seed,
        round_=round_,
    )
    return DpRound(mean, norms, sum(n > clip_norm for n in norms.values()))


# --- adaptive clipping (Andrew et al. 2021) -----------------------------------------------------


def split_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """z_Delta, the update sum's noise multiplier when the clip count takes noise sigma_b out
    of the budget of z: z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. 2021: the
    count of (b_i - 1/2) has sensitivity 1/2, so its noise multiplier is 2 sigma_b, and two
    Gaussian queries compose like one with z^-2 = z_Delta^-2 + (2 sigma_b)^-2)."""
    check_noise_multiplier(noise_multiplier)
    if not _positive(count_stddev):
        raise ConfigError(
            f"privacy.adaptive_clip.count_stddev must be a finite number > 0 (got {count_stddev!r})"
        )
    if noise_multiplier == 0:
        return 0.0
    rest = noise_multiplier**-2 - (2 * count_stddev) ** -2
    if rest <= 0:
        raise ConfigError(
            f"privacy.adaptive_clip.count_stddev={count_stddev:g} is too small for "
            f"privacy.noise_multiplier={noise_multiplier:g}: it must exceed z/2 = "
            f"{noise_multiplier / 2:g} (the paper's default is expected cohort / 20)"
        )
    return rest**-0.5


@dataclass(frozen=True)
class AdaptiveClipConfig:
    """Andrew et al. 2021's hyper-parameters (their defaults: gamma 0.5, eta_C 0.2,
    sigma_b = expected cohort / 20, C_0 0.1)."""

    initial_clip: float = 0.1
    target_quantile: float = 0.5  # gamma
    learning_rate: float = 0.2  # eta_C
    count_stddev: float = 1.0  # sigma_b

    def __post_init__(self) -> None:
        check_clip(self.initial_clip, "privacy.clip")
        q = self.target_quantile
        if not _finite(q) or not 0 <= q <= 1:
            raise ConfigError(
                f"privacy.adaptive_clip.target_quantile must be a number in [0, 1] (got {q!r})"
            )
        if not _positive(self.learning_rate):
            raise ConfigError(
                "privacy.adaptive_clip.learning_rate must be a finite number > 0 "
                f"(got {self.learning_rate!r})"
            )
        if not _finite(self.count_stddev) or self.count_stddev < 0:
            raise ConfigError(
                "privacy.adaptive_clip.count_stddev must be a finite number >= 0 "
                f"(got {self.count_stddev!r})"
            )


class AdaptiveClip:
    """The clip norm of each round, moved by a noisy quantile estimate of the update norms."""

    def __init__(self, config: AdaptiveClipConfig) -> None:
        self.config = config
        self.clip_norm = float(config.initial_clip)

    def update(
        self, norms: Mapping[int, float], *, expected_cohort: float, seed: int, round_: int
    ) -> float:
        """Move C after a round whose clients had these pre-clipping norms; return the new C.

        b~ = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2 with b_i = [norm_i <= C] and m the
        expected cohort (Andrew et al. 2021), then C <- C exp(-eta_C (b~ - gamma)).
        """
        if not _positive(expected_cohort):
            raise ConfigError(f"the expected cohort size must be > 0 (got {expected_cohort!r})")
        cfg = self.config
        centered = sum(
            (1.0 if n <= self.clip_norm else 0.0) - 0.5 for _, n in sorted(norms.items())
        )
        g = torch.Generator().manual_seed(noise_seed(seed, round_, CLIP_COUNT))
        noise = float(torch.randn((), generator=g, dtype=torch.float64)) * cfg.count_stddev
        fraction = (centered + noise) / expected_cohort + 0.5
        self.clip_norm *= math.exp(-cfg.learning_rate * (fraction - cfg.target_quantile))
        return self.clip_norm

    def state_dict(self) -> dict[str, Any]:
        return {"clip_norm": self.clip_norm}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.clip_norm = float(state["clip_norm"])
