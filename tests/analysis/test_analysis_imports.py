"""The analysis package imports neither torch nor wandb on its own (wandb only inside the W&B loader)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import dataflex_rl.keys
torch_from_core = "torch" in sys.modules
import analysis.aggregate, analysis.load, analysis.plots, analysis.report, analysis.tables
print(torch_from_core, "torch" in sys.modules, "wandb" in sys.modules)
"""


def test_analysis_adds_no_torch_and_no_wandb_import() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    torch_from_core, torch_after, wandb_after = result.stdout.split()
    # torch may only be there because the dataflex_rl package itself imports it; analysis must add nothing
    assert torch_after == torch_from_core
    assert wandb_after == "False"
