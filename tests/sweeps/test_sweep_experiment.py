"""Named experiments: ``make sweep EXPERIMENT=kk`` picks a run setting and its grid in one word (no processes)."""

from __future__ import annotations

import pytest

from dataflex_rl.compose import compose_train_config
from dataflex_rl.run_config import parse_train_config
from dataflex_rl.validation import ConfigError
from sweeps.backends import get_backend
from sweeps.cli import load_config
from sweeps.sweep_config import CONF_DIR, available_experiments, grid_presets, run_extra, run_steps
from sweeps.grid import default_name, expand_grid
from sweeps.make import VARIABLES, sweep_argv


def config_of(*argv: str):
    return load_config(list(argv))[1]


def test_kk_is_a_named_experiment_with_both_files():
    assert "kk" in available_experiments()
    assert (CONF_DIR / "experiment" / "kk.yaml").is_file() and (CONF_DIR / "sweeps" / "experiment" / "kk.yaml").is_file()


def test_a_single_run_composes_the_experiment_over_the_defaults():
    plain = parse_train_config(compose_train_config(["run_dir=x"]))
    kk = parse_train_config(compose_train_config(["run_dir=x", "experiment=kk"]))
    later = parse_train_config(compose_train_config(["run_dir=x", "experiment=kk", "sft.steps=7"]))
    assert plain.experiment is None and plain.task.name == "arithmetic"
    assert kk.experiment == "kk" and kk.task.name == "knights_knaves"
    assert kk.task.params["test_size"] >= kk.trainer.val_size == 1024  # every validation puzzle held out
    assert kk.sft.steps != plain.sft.steps
    assert later.sft.steps == 7  # the command line still wins over the experiment


def test_the_sweep_runs_the_paper_ablation_with_the_experiment_first():
    config = config_of("experiment=kk")
    assert config.experiment == "kk"
    assert grid_presets(config) == ("baseline", "ar_paper", "ar", "lopti_paper")
    assert run_steps(config) is None  # the experiment's own trainer.total_steps
    assert run_extra(config)[0] == "experiment=kk"
    specs = expand_grid(config)
    assert len(specs) == 4 * len(config.seeds)
    assert default_name(config).startswith("kk-")
    runs = get_backend(config.backend).plan(config, specs[:2], "kk-test", CONF_DIR.parent / "runs" / "kk-test", 1)
    assert all(run.overrides[0] == "experiment=kk" for run in runs), runs[0].overrides
    extra = config_of("experiment=kk", "extra=[trainer.lr=3e-4]")
    assert run_extra(extra) == ("experiment=kk", "trainer.lr=3e-4")  # EXTRA adds to the experiment, never replaces it
    assert config_of("experiment=kk", "seeds=1,2").seeds == (1, 2)


def test_make_experiment_reaches_the_driver_as_one_key():
    values = {name: "" for name in VARIABLES} | {"EXPERIMENT": "kk", "ALPHA": "0.5"}
    assert sweep_argv(values) == ["experiment=kk", "alpha=0.5"]


@pytest.mark.parametrize("argv, message", [
    (("experiment=nope",), r"experiment"),
    (("experiment=kk", "backend=verl"), r"experiment = 'kk' is not allowed with backend=verl"),
])
def test_bad_experiment_is_refused_naming_key_and_allowed(argv, message):
    with pytest.raises(ConfigError, match=message):
        config_of(*argv)


def test_long_addition_is_a_named_experiment_whose_sweep_runs_the_ablation():
    run = parse_train_config(compose_train_config(["run_dir=x", "experiment=long_addition"]))
    assert run.task.name == "long_addition" and run.task.built.config.sft_max_digits is None
    assert (run.sft.steps, run.trainer.lr, run.trainer.total_steps, run.trainer.val_every) == (200, 3e-5, 100, 10)
    assert run.task.params["test_size"] >= run.trainer.val_size == 1024
    config = config_of("experiment=long_addition")
    assert grid_presets(config) == ("baseline", "ar_paper", "ar", "lopti_paper", "ar_lopti_paper")
    assert run_steps(config) is None and run_extra(config)[0] == "experiment=long_addition"
    assert len(expand_grid(config)) == 5 * len(config.seeds)
