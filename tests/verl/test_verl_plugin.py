"""verl finds the dataflex trainer modes and the policy-loss route through the installed ``verl.plugins`` entry
point alone, and the route without verl's V1 trainers and TransferQueue."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

PLUGIN_MODULE = "dataflex_rl.verl.plugin"


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


def test_entry_point_names_the_plugin_module():
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
        "import dataflex_rl.verl.plugin, dataflex_rl.verl.check, dataflex_rl.verl.command, dataflex_rl.verl.record\n"
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


# A verl without its V1 trainers and TransferQueue (verl's neo branch removes both): the modules do not import.
HIDE_V1 = """
import importlib.abc, sys
HIDDEN = ("transfer_queue", "verl.trainer.ppo.v1")
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == module or name.startswith(module + ".") for module in HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""


def test_the_route_registers_and_runs_without_v1_and_transferqueue(tmp_path):
    code = HIDE_V1 + (
        "import torch, verl\n"  # verl loads the entry point: the plugin, as in every verl process
        "from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
        "from verl.workers.config import ActorConfig\n"
        "import dataflex_rl.verl.plugin as plugin\n"
        "from dataflex_rl.verl.route_config import DataflexPolicyLossConfig\n"
        "block = {'mechanism': 'reweight', 'actuator': {'name': 'advantage_reweight', 'params': {'alpha': 0.5}}}\n"
        "route = DataflexPolicyLossConfig(loss_mode='dataflex', dataflex=block)\n"
        "config = ActorConfig(strategy='fsdp', rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=route)\n"
        "old = torch.log(torch.tensor([[0.2, 0.6, 0.9]]))\n"
        "loss, metrics = get_policy_loss_fn('dataflex')(old_log_prob=old, log_prob=old, advantages=torch.ones(1, 3),\n"
        "    response_mask=torch.ones(1, 3, dtype=torch.bool), loss_agg_mode='token-mean', config=config)\n"
        "hidden = sorted(name for name in sys.modules if name.startswith(HIDDEN))\n"
        "print(plugin.TRAINER_MODES_MISSING, hidden, round(float(loss), 6), metrics['dataflex/weight/std'] > 0)\n"
    )
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # token-mean vanilla loss at ratio 1: -mean(w) = -1, the weights mean-normalised over the three tokens
    assert result.stdout.strip().splitlines()[-1] == "transfer_queue [] -1.0 True"
