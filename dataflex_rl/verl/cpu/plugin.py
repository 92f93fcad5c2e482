"""Imported by verl in each process for the CPU mode: checks, then registers platform, engines, rollout."""

from __future__ import annotations

from dataflex_rl.verl.cpu import check_platform_selected, check_verl_version
from dataflex_rl.verl.cpu.patches import apply_all

check_verl_version()
check_platform_selected()
apply_all()
