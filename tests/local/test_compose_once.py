"""A run's config is composed once: ``python -m dataflex_rl.local.train <overrides>`` composes ``conf/train.yaml`` once,
and ``--config-file`` composes nothing; either validates once, logs as Hydra did,
and refuses what it refused before, touching nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dataflex_rl.compose import compose_train_config
from dataflex_rl.tracking.run_store import read_config
from dataflex_rl.run_config import CONFIG_FILE_FLAG, write_config_file
from dataflex_rl.local.train import main as train_main
from tests.counted_train import COUNT_ENV, compositions

from .conftest import REPO, tiny_overrides

# Hydra's job logging format: [time][logger][LEVEL] - message
HYDRA_LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]\[[\w.]+\]\[[A-Z]+\] - ")


def counted_cli(arguments: list[str], count_file) -> subprocess.CompletedProcess:
    """``python -m dataflex_rl.local.train <arguments>`` with every composition of conf/train.yaml counted in count_file."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1",
           COUNT_ENV: str(count_file)}
    return subprocess.run([sys.executable, "-m", "tests.counted_train", *arguments], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_overrides_are_composed_once_and_a_config_file_never(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    count = tmp_path / "composed"
    result = counted_cli(tiny_overrides(run_dir, sft_cache, steps=1), count)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(compositions(count)) == 1
    # train.log and the console get the same lines, in Hydra's format
    log_lines = (run_dir / "train.log").read_text().splitlines()
    assert log_lines and all(HYDRA_LOG_LINE.match(line) for line in log_lines), log_lines[:3]
    assert set(log_lines) <= set(result.stdout.splitlines())
    # once each: no handler an imported library installed on the root logger prints them again in its own format
    console = (result.stdout + result.stderr).splitlines()
    messages = [line.split("] - ", 1)[1] for line in log_lines]
    assert all(sum(message in line for line in console) == 1 for message in messages), console[:10]

    # The driver's way: the resolved config in a file, read and validated by the trainer, never composed.
    resolved = compose_train_config(tiny_overrides(tmp_path / "from-file", sft_cache, steps=1))
    config_file = tmp_path / "launch" / "run.yaml"
    write_config_file(config_file, resolved, comment=["a test's config"])
    result = counted_cli([CONFIG_FILE_FLAG, str(config_file)], tmp_path / "composed-from-file")
    assert result.returncode == 0, result.stderr[-3000:]
    assert compositions(tmp_path / "composed-from-file") == []
    assert read_config(tmp_path / "from-file") == resolved  # the run store records the file's config as it is
    assert (tmp_path / "from-file" / "train.log").read_text().strip()

    # A resume from a file that differs from the recorded run is refused, touching nothing.
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / "from-file").rglob("*") if path.is_file()}
    changed = {**resolved, "trainer": {**resolved["trainer"], "lr": 0.01}}
    write_config_file(config_file, changed)
    code, error = run_main([CONFIG_FILE_FLAG, str(config_file)])
    assert code == 2 and "trainer.lr: recorded" in error
    assert {path: path.stat().st_mtime_ns for path in before} == before


def run_main(arguments: list[str]) -> tuple[int, str]:
    """``python -m dataflex_rl.local.train <arguments>`` in this process: (exit code, stderr)."""
    import contextlib
    import io

    stderr = io.StringIO()
    saved = sys.argv
    sys.argv = ["dataflex_rl.local.train", *arguments]
    try:
        with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exited:
            train_main()
    finally:
        sys.argv = saved
    return exited.value.code, stderr.getvalue()


@pytest.mark.parametrize(("arguments", "message"), [
    (["--config-file"], "--config-file takes one path and nothing else"),
    (["--config-file", "x.yaml", "seed=2"], "--config-file takes one path and nothing else"),
    (["--config-file", "/nonexistent/launch.yaml"], "config file /nonexistent/launch.yaml cannot be read"),
    (["-m", "seed=1,2"], "-m is not allowed: give overrides key=value"),
])
def test_a_bad_config_file_argument_is_refused(arguments, message):
    code, error = run_main(arguments)
    assert code == 2 and message in error


def test_a_config_file_with_a_bad_value_or_no_mapping_is_refused_before_run_dir_exists(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    resolved = compose_train_config(tiny_overrides(run_dir, sft_cache))
    resolved["dataflex"]["actuator"]["params"]["alpha"] = 2
    config_file = tmp_path / "bad.yaml"
    write_config_file(config_file, resolved)
    code, error = run_main([CONFIG_FILE_FLAG, str(config_file)])
    assert code == 2 and "bad config: " in error and "alpha = 2" in error
    assert not run_dir.exists()
    config_file.write_text("- a list\n")
    code, error = run_main([CONFIG_FILE_FLAG, str(config_file)])
    assert code == 2 and "holds a list, expected a resolved conf/train.yaml" in error


def test_cfg_prints_the_composed_config_and_runs_nothing(capsys):
    saved = sys.argv
    sys.argv = ["dataflex_rl.local.train", "--cfg", "job", "run_dir=x", "trainer.lr=0.003"]
    try:
        train_main()
    finally:
        sys.argv = saved
    import yaml

    assert yaml.safe_load(capsys.readouterr().out) == compose_train_config(["run_dir=x", "trainer.lr=0.003"])
