"""The warm-start design (sweep key ``warm_start``): which SFT warm start each run gets, how the sweep records it,
and a short real per-seed sweep whose report says what its intervals cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataflex_rl.tinylm.sft import sft_cache_key
from dataflex_rl.validation import ConfigError
from sweeps.backends import get_backend
from sweeps.cli import load_config, main
from sweeps.grid import expand_grid
from sweeps.manifest import SweepMismatchError, check_sweep_settings
from sweeps.sweep_config import common_overrides

from .conftest import plan_of, read_manifest, tiny_extra

LOCAL, VERL = get_backend("local"), get_backend("verl")
local_overrides, local_runs, verl_command, verl_prepare = LOCAL.overrides, LOCAL.runs, VERL.command, VERL.warm_starts


def config_of(*argv: str):
    return load_config(list(argv))[1]


def cache_keys(config, tmp_path: Path) -> dict[str, str]:
    """run name -> the SFT cache key of the run's composed config (the trainer's own key)."""
    specs = expand_grid(config)
    entries = [(spec, local_overrides(config, spec, "w", tmp_path, 1), tmp_path / spec.name) for spec in specs]
    _, train_configs = local_runs(config, entries, tmp_path, {})
    return {spec.name: sft_cache_key(train.model, train.task, train.sft)
            for spec, train in zip(specs, train_configs, strict=True)}


def test_per_seed_warm_starts_differ_across_seeds_and_agree_across_arms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default sft.cache_dir, relative, empty here: both warm starts are to build
    config = config_of("alpha=0.25,0.5", "seeds=1,2")
    assert config.warm_start == "per_seed"  # the default: the recipe's answer
    specs = expand_grid(config)
    assert [(spec.name, spec.warm_start_seed) for spec in specs] == [
        ("a0.0-s1", 1), ("a0.0-s2", 2), ("a0.25-s1", 1), ("a0.25-s2", 2), ("a0.5-s1", 1), ("a0.5-s2", 2)]
    assert specs[2].overrides == ("++dataflex.actuator.params.alpha=0.25", "seed=1", "sft.seed=1")
    keys = cache_keys(config, tmp_path)
    assert keys["a0.0-s1"] == keys["a0.25-s1"] == keys["a0.5-s1"]
    assert keys["a0.0-s2"] == keys["a0.25-s2"] == keys["a0.5-s2"]
    assert keys["a0.0-s1"] != keys["a0.0-s2"]
    warm_starts = get_backend(config.backend).warm_starts(config, specs, tmp_path, 1)
    assert [run.name for run in warm_starts] == ["sft-seed1", "sft-seed2"]
    assert [run.overrides[-4:-2] for run in warm_starts] == [("sft.seed=1", "mode=sft"), ("sft.seed=2", "mode=sft")]


def test_a_shared_warm_start_is_one_key_for_every_run(tmp_path):
    config = config_of("alpha=0.5", "seeds=1,2,3", "warm_start=shared")
    specs = expand_grid(config)
    assert {spec.warm_start_seed for spec in specs} == {None}
    assert all(not any(item.startswith("sft.seed") for item in spec.overrides) for spec in specs)
    assert len(set(cache_keys(config, tmp_path).values())) == 1
    assert [run.name for run in get_backend(config.backend).warm_starts(config, specs, tmp_path, 1)] == ["sft"]


def test_sft_relevant_axes_and_seeds_each_get_their_warm_start(tmp_path):
    config = config_of("alpha=0.5", "seeds=1,2", "extra=[sft.steps=2,3]", "add_baseline=false")
    names = [run.name for run in get_backend(config.backend).warm_starts(config, expand_grid(config), tmp_path, 1)]
    assert names == ["sft-0-seed1", "sft-0-seed2", "sft-1-seed1", "sft-1-seed2"]
    assert len(set(cache_keys(config, tmp_path).values())) == 4


def test_per_seed_refuses_an_sft_seed_from_extra_naming_the_way_out():
    for extra in ("extra=[sft.seed=3]", "extra=[sft.seed=1,2]"):
        with pytest.raises(ConfigError, match=r"extra = 'sft\.seed=.*' is not allowed with warm_start=per_seed.*"
                                              r"warm_start=shared"):
            config_of("alpha=0.5", "seeds=1", extra)
    assert common_overrides(config_of("alpha=0.5", "seeds=1", "warm_start=shared", "extra=[sft.seed=3]"))[0].value == "3"
    with pytest.raises(ConfigError, match=r"warm_start = 'each' is not allowed; allowed values: 'per_seed', 'shared'"):
        config_of("warm_start=each")


def test_growing_a_sweep_keeps_its_design_and_changing_it_is_refused_naming_the_key(tmp_path):
    recorded = plan_of(config_of("alpha=0.5", "seeds=1", f"root={tmp_path}", "name=w")).header()
    assert recorded["warm_start"] == "per_seed"
    grown = plan_of(config_of("alpha=0.5,0.25", "seeds=1,2", f"root={tmp_path}", "name=w")).header()
    check_sweep_settings(tmp_path / "w", recorded, grown)  # more seeds and alphas: the same design, accepted
    changed = plan_of(config_of("alpha=0.5", "seeds=1", "warm_start=shared", f"root={tmp_path}",
                                   "name=w")).header()
    with pytest.raises(SweepMismatchError, match=r"warm_start: recorded 'per_seed', now 'shared'"):
        check_sweep_settings(tmp_path / "w", recorded, changed)


def test_verl_runs_read_the_prepared_folder_of_their_warm_start(tmp_path):
    config = config_of("backend=verl", "verl.experiment=verl_cpu_tiny", "alpha=0.5", "seeds=1,2", "validate=false")
    specs = expand_grid(config)
    prepares = verl_prepare(config, specs, tmp_path, 1)
    assert [run.name for run in prepares] == ["verl-prepare-sft-seed1", "verl-prepare-sft-seed2"]
    assert [run.command[-1] for run in prepares] == ["sft.seed=1", "sft.seed=2"]
    for spec in specs:
        command = verl_command(config, spec, "w", tmp_path)
        model = tmp_path / "verl_prepared" / f"sft-seed{spec.seed}" / "model"
        assert f"actor_rollout_ref.model.path={model}" in command
        assert "+dataflex_run.warm_start=per_seed" in command
    shared = config_of("backend=verl", "verl.experiment=verl_cpu_tiny", "seeds=1,2", "warm_start=shared",
                       "validate=false")
    assert [run.run_dir.name for run in verl_prepare(shared, expand_grid(shared), tmp_path, 1)] == ["shared"]


@pytest.mark.slow
def test_a_short_real_per_seed_sweep_records_each_warm_start_and_reports_its_design(tmp_path, sft_cache, capsys):
    sweep_dir = tmp_path / "runs" / "ws"
    argv = ["alpha=0.5", "seeds=1,2", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=ws",
            tiny_extra(sft_cache)]
    assert main(argv) == 0
    output = capsys.readouterr().out
    assert "warm_start=per_seed" in output and "Design: each seed its own SFT warm start" in output
    manifest = read_manifest(sweep_dir)
    assert manifest["warm_start"] == "per_seed"
    assert {entry["run"]: entry["warm_start_seed"] for entry in manifest["runs"]} == {
        "a0.0-s1": 1, "a0.0-s2": 2, "a0.5-s1": 1, "a0.5-s2": 2}
    records = {name: json.loads((sweep_dir / name / "meta.json").read_text())["warm_start"]
               for name in ("a0.0-s1", "a0.0-s2", "a0.5-s1", "a0.5-s2")}
    assert {name: (record["design"], record["sft_seed"]) for name, record in records.items()} == {
        "a0.0-s1": ("per_seed", 1), "a0.0-s2": ("per_seed", 2), "a0.5-s1": ("per_seed", 1),
        "a0.5-s2": ("per_seed", 2)}
    assert records["a0.0-s1"]["checkpoint"] == records["a0.5-s1"]["checkpoint"] != records["a0.0-s2"]["checkpoint"]
    assert all(Path(record["checkpoint"], "done.json").is_file() for record in records.values())
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "Design: each seed its own SFT warm start (warm_start=per_seed: 2 warm starts" in report
    assert "include the RL seed and the warm start's draw" in report
    warm_start_section = report.split("## Warm starts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in warm_start_section.splitlines() if line.startswith("|")][2:]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]  # the sft.seed column, one row each


def test_a_verl_sweep_records_its_experiment_file_and_refuses_a_rerun_from_an_edited_one(tmp_path):
    from dataflex_rl.verl.command import resolve_experiment

    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(resolve_experiment("verl_cpu_tiny").read_text())

    def header():
        return plan_of(config_of("backend=verl", f"verl.experiment={experiment}", "alpha=0.5", "seeds=1",
                                 "validate=false", f"root={tmp_path}", "name=v")).header()

    recorded = header()
    assert recorded["backend_settings"]["experiment"] == str(experiment)
    check_sweep_settings(tmp_path / "v", recorded, header())  # the same file: accepted
    experiment.write_text(experiment.read_text() + "# edited\n")
    with pytest.raises(SweepMismatchError, match=r"backend_settings: recorded \{'experiment': .*'experiment_hash'"):
        check_sweep_settings(tmp_path / "v", recorded, header())
    assert "backend_settings" not in plan_of(config_of("alpha=0.5", "seeds=1", f"root={tmp_path}")).header()


def test_growing_a_sweep_builds_only_the_warm_starts_of_runs_left_to_run(tmp_path, repo_on_path) -> None:
    """A warm start serves the runs of its seed; a seed whose runs are all complete gets none built again (a grown
    sweep on another CPU kernel set, whose cache keys all differ, used to rebuild them all)."""
    calls = tmp_path / "cache" / "sft_calls"
    argv = ["alpha=0.5", "steps=1", f"root={tmp_path / 'runs'}", "name=grown", "train_module=tests.sweeps.scripted_train",
            "validate=false", "poll_s=0.05", f"extra=[sft.cache_dir={tmp_path / 'cache'}]"]
    assert main([*argv, "seeds=1,2"]) == 0
    assert sorted(line.split("sft.seed=")[1].split()[0] for line in calls.read_text().splitlines()) == ["1", "2"]
    assert main([*argv, "seeds=1,2,3"]) == 0
    assert sorted(line.split("sft.seed=")[1].split()[0] for line in calls.read_text().splitlines()) == ["1", "2", "3"]
