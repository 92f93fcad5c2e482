"""Run seeds map one to one onto the per-step seeds; a seed that would repeat another's runs is refused."""

from __future__ import annotations

import pytest

from dataflex_rl.run_config import parse_train_config
from dataflex_rl.local.trainer import step_seed
from dataflex_rl.validation import SEED_MODULUS, ConfigError, check_seed


def test_the_largest_allowed_seeds_stay_distinct_from_the_smallest():
    largest = SEED_MODULUS - 1
    assert check_seed("seed", largest) == largest
    for step in (0, 1, 399):
        values = {step_seed(seed, step) for seed in (0, 1, 2, largest - 1, largest)}
        assert len(values) == 5


@pytest.mark.parametrize(("seed", "repeats"), [(SEED_MODULUS + 1, 1), (SEED_MODULUS, 0), (2**31, 1)])
def test_a_seed_outside_the_one_to_one_range_is_refused(seed, repeats):
    assert step_seed(seed, 3) == step_seed(repeats, 3)  # why: the runs would be bit-identical
    with pytest.raises(ConfigError, match=rf"seed = {seed} is not allowed: a seed is an integer in "
                                          rf"\[0, {SEED_MODULUS - 1}\].*repeat the runs of seed {repeats}"):
        parse_train_config({"run_dir": "x", "seed": seed, "task": {"name": "arithmetic"}})
