"""verl finds the ``dataflex_sync`` trainer through the installed ``verl.plugins`` entry point alone."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

PLUGIN_MODULE = "dataflex_rl.verl.trainer"


def clean_environment() -> dict[str, str]:
    """The environment without the variables that change how verl loads plugins."""
    return {
        key: value
        for key, value in os.environ.items()
        if key not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS", "PYTHONPATH")
    }


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        check=False,
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_entry_point_names_the_trainer_module():
    plugins = {entry.name: entry.value for entry in entry_points(group="verl.plugins")}
    assert plugins.get("dataflex") == PLUGIN_MODULE


def test_command_module_does_not_import_verl(tmp_path):
    """Sweep drivers build verl command lines without paying for verl's import (seconds per process)."""
    result = run_python("import sys, dataflex_rl.verl.command\nprint('verl' in sys.modules)", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "False"


@pytest.mark.slow  # a fresh process importing verl's trainer stack: 20-40 s on a shared 2-core machine
def test_the_plugin_imports_nothing_beyond_what_verls_sync_trainer_imports(tmp_path):
    """On a GPU cluster the project is installed with ``--no-deps`` beside verl's own pins, so the plugin (and what
    it imports: the mechanism, the run store, the staged loss, the doctor) may import only what verl imports to run
    its own sync trainer (``main_ppo``, the V1 sync trainer, the engine workers that hold ``ppo_loss``)."""
    code = (
        "import sys\n"
        "import verl.trainer.main_ppo, verl.trainer.ppo.v1.trainer_sync, verl.workers.engine_workers\n"
        "before = {name.split('.')[0] for name in sys.modules}\n"
        "import dataflex_rl.verl.trainer, dataflex_rl.verl.check, dataflex_rl.verl.command\n"
        "new = {name.split('.')[0] for name in sys.modules} - before - set(sys.stdlib_module_names)\n"
        "print(sorted(name for name in new if not name.startswith('_')))\n"
    )
    # This checkout's code (PYTHONPATH kept), and verl must not pre-load the plugin through its entry point.
    environment = {**{key: value for key, value in os.environ.items() if key != "VERL_USE_EXTERNAL_MODULES"},
                   "VERL_USE_EXTERNAL_PLUGINS": "none"}
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=False, cwd=tmp_path, env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "['dataflex_rl']"
