"""``privacy:`` in params (issue 48): off by default and out of the flat view, started by a
``--set privacy.<key>``, and every bad setting refused in one line before any data."""

from __future__ import annotations

import pytest

from tasks.config import load_params
from tests.cli_contract import REPO, assert_one_clear_line, invoke


def test_privacy_is_off_by_default_and_absent_from_the_flat_view():
    p = load_params(REPO / "params.yaml")
    assert p.privacy is None
    assert not any(k.startswith("privacy") for k in p.flat())  # keys of earlier runs unchanged


def test_a_key_set_under_privacy_starts_it_from_its_defaults():
    p = load_params(REPO / "params.yaml", ["privacy.noise_multiplier=1.5"])
    assert p.privacy is not None
    assert (p.privacy.clip, p.privacy.delta, p.privacy.accountant) == (1.0, 1e-5, "rdp")
    assert p.flat()["privacy.noise_multiplier"] == 1.5
    q = load_params(
        REPO / "params.yaml",
        ["privacy.target_epsilon=4", "privacy.adaptive_clip.target_quantile=0.7"],
    )
    assert q.privacy is not None and q.privacy.adaptive_clip is not None
    assert q.privacy.adaptive_clip.target_quantile == 0.7


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["privacy.clip=1"], "give noise_multiplier"),
        (["privacy.noise_multiplier=-1"], "privacy.noise_multiplier"),
        (["privacy.noise_multiplier=1", "privacy.clip=0"], "privacy.clip"),
        (["privacy.target_epsilon=0"], "privacy.target_epsilon"),
        (["privacy.noise_multiplier=1", "privacy.delta=1.5"], "privacy.delta"),
        (["privacy.noise_multiplier=1", "privacy.delta=0.2"], "privacy.delta must be < 1/N"),
        (["privacy.noise_multiplier=1", "privacy.accountant=pld"], "pld cannot account"),
        (["privacy.noise_multiplier=1", "privacy.accountant=moments"], "privacy.accountant"),
        (["privacy.noise_multiplier=1", "privacy.bogus=1"], "privacy.bogus"),
        (["privacy.noise_multiplier=1", "privacy.adaptive_clip.target_quantile=2"],
         "privacy.adaptive_clip.target_quantile"),
        (["privacy.noise_multiplier=1", "federation.sampling=with_replacement"],
         "privacy needs without_replacement"),
        (["privacy.noise_multiplier=0.3", "privacy.target_epsilon=20"],
         "privacy.target_epsilon=20 is spent by round 1 already"),
        (["privacy.target_epsilon=0.01", "federation.rounds=50"], "cannot be met in 50 rounds"),
        (["privacy.noise_multiplier=1", "grid.algorithms=[fednova]"],
         "privacy (client-level DP) cannot run with fednova"),
        (["privacy.noise_multiplier=1", "grid.algorithms=[scaffold]"],
         "privacy (client-level DP) cannot run with scaffold"),
        (["privacy.noise_multiplier=1", "grid.algorithms=[fedir]"],
         "privacy (client-level DP) cannot run with fedir"),
        (["privacy.noise_multiplier=1", "grid.algorithms=[fedvc]"],
         "privacy (client-level DP) cannot run with fedvc"),
    ],
)  # fmt: skip
def test_bad_privacy_settings_are_one_line_before_any_data(tmp_path, args, needle):
    sets = [x for a in args for x in ("--set", a)]
    res = invoke(tmp_path, "run", *sets)
    assert_one_clear_line(res, needle, tmp_path / "reports")
