"""The module verl imports in each of its processes for the CPU mode (``VERL_USE_EXTERNAL_MODULES``): importing it
checks the verl version and ``VERL_PLATFORM``, then registers the platform, engines and rollout
(:func:`dataflex_rl.verl.cpu.patches.apply_all`)."""

from __future__ import annotations

from dataflex_rl.verl.cpu import check_platform_selected, check_verl_version
from dataflex_rl.verl.cpu.patches import apply_all

check_verl_version()
check_platform_selected()
apply_all()
