"""The devices the mechanism tests run on: the CPU always, CUDA too where a GPU is at hand (on a machine without
one the CUDA cases are not generated, rather than skipped). Tensors are built on the device; assertions compare
on the CPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from dataflex_rl import build_mechanism
from dataflex_rl.mechanism import MechanismOutput

DEVICES = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def on(device: str, fields: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``fields`` moved to ``device``."""
    return {name: value.to(device) for name, value in fields.items()}


def assert_on(device: str, *tensors: torch.Tensor | None) -> None:
    """Every tensor given (``None`` aside) is on ``device``."""
    for tensor in tensors:
        assert tensor is None or tensor.device.type == torch.device(device).type, (tensor.device, device)


def on_cpu(device: str, output: MechanismOutput) -> MechanismOutput:
    """``output`` with its tensors checked to be on ``device``, then brought to the CPU for the assertions."""
    stage_masks = output.stage_masks or []
    assert_on(device, output.advantages, output.weights, *stage_masks)
    return dataclasses.replace(
        output, advantages=output.advantages.cpu(), weights=None if output.weights is None else output.weights.cpu(),
        stage_masks=None if output.stage_masks is None else [mask.cpu() for mask in stage_masks])


def processed(device: str, block: Mapping[str, Any], step: int, fields: Mapping[str, torch.Tensor]) -> MechanismOutput:
    """``build_mechanism(block).process(step, fields)`` on ``device``, the output brought back to the CPU."""
    return on_cpu(device, build_mechanism(block).process(step, on(device, fields)))
