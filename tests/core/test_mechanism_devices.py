"""What a GPU hands the mechanism: tensors on its device, ``old_log_probs`` in float32, bfloat16 or float16, large
batches. Outputs stay on the batch's device, low-precision log-probs are read in float32, and a step reads the
host once (on a CUDA device every other synchronisation would stall the step)."""

from __future__ import annotations

import collections
import contextlib
import math
import warnings
from collections.abc import Iterator

import pytest
import torch

from dataflex_rl import build_mechanism, keys
from tests.core.devices import assert_on, on

AR = {"mechanism": "reweight", "scorer": {"name": "token_prob"},
      "actuator": {"name": "advantage_reweight", "params": {"alpha": 0.5}}, "warmup_step": 0}
LOPTI = {"mechanism": "isolate", "scorer": {"name": "token_prob"},
         "actuator": {"name": "lopti", "params": {"eta": 0.5, "alpha": 0.5}}, "warmup_step": 0}
LOPTI_QUANTILE = {**LOPTI, "actuator": {"name": "lopti", "params": {"eta": 0.5, "alpha": 0.3, "split": "quantile"}}}
HIGH_ENTROPY = {"scorer": {"name": "entropy"}, "actuator": {"name": "entropy_quantile"}, "warmup_step": 0}
STAPO = {"scorer": {"name": "entropy"}, "actuator": {"name": "stapo"}, "warmup_step": 0}
BLOCKS = {"ar": AR, "lopti": LOPTI, "lopti_quantile": LOPTI_QUANTILE, "high_entropy": HIGH_ENTROPY, "stapo": STAPO}

# Reads of a tensor's values on the host: each is a synchronisation on an accelerator.
HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__", "__index__")


def batch(rows: int = 16, length: int = 64, log_prob_dtype: torch.dtype = torch.float32, seed: int = 0
          ) -> dict[str, torch.Tensor]:
    """A verl-like batch: integer response mask (right padding), GRPO-like advantages, entropy."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows, 1), generator=generator)
    mask = (torch.arange(length) < lengths).long()
    return {
        "old_log_probs": (-torch.rand(rows, length, generator=generator) * 4).to(log_prob_dtype),
        "response_mask": mask,
        "advantages": torch.randn(rows, 1, generator=generator).expand(rows, length) * mask,
        "entropy": torch.rand(rows, length, generator=generator) * 3,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_low_precision_log_probs_are_read_in_float32(device, dtype):
    # log pi = 0, -1, -2 are exact in every dtype: pi = 1, 1/e, 1/e^2; alpha = 0.5: raw w = 0.5 pi + 0.5,
    # divided by their mean. Computed in the log-probs' dtype they would be off by ~1e-3 (bfloat16's 8 bits).
    raw = [0.5 * math.exp(-k) + 0.5 for k in range(3)]
    expected = torch.tensor([[value / (sum(raw) / 3) for value in raw]])
    fields = on(device, {"old_log_probs": torch.tensor([[0.0, -1.0, -2.0]], dtype=dtype),
                         "response_mask": torch.ones(1, 3, dtype=torch.long),
                         "advantages": torch.tensor([[1.0, -2.0, 3.0]])})
    output = build_mechanism(AR).process(1, fields)
    assert output.weights.dtype == torch.float32 and output.advantages.dtype == torch.float32
    assert_on(device, output.advantages, output.weights)
    torch.testing.assert_close(output.weights.cpu(), expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(output.advantages.cpu(), expected * torch.tensor([[1.0, -2.0, 3.0]]), rtol=1e-6, atol=0)
    assert output.metrics[keys.TOKEN_PROB_MEAN] == pytest.approx((1 + math.exp(-1) + math.exp(-2)) / 3, rel=1e-6)
    # Advantages in bfloat16 come back in bfloat16, rounded once (relative error at most 2**-9).
    fields["advantages"] = fields["advantages"].to(torch.bfloat16)
    reweighted = build_mechanism(AR).process(1, fields).advantages
    assert reweighted.dtype == torch.bfloat16
    assert_on(device, reweighted)
    torch.testing.assert_close(reweighted.float().cpu(), expected * torch.tensor([[1.0, -2.0, 3.0]]),
                               rtol=2**-8, atol=0)
    # Lopti splits on the float32 pi: 1/e and 1/e^2 are below eta = 0.5, 1 is not.
    stages = build_mechanism(LOPTI).process(1, fields).stage_masks
    assert_on(device, *stages)
    assert [stage.cpu().tolist() for stage in stages] == [[[False, True, True]], [[True, False, False]]]


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_every_output_stays_on_the_batch_device(device, name):
    fields = on(device, batch(log_prob_dtype=torch.bfloat16))
    output = build_mechanism(BLOCKS[name]).process(1, fields, histograms=True)
    assert_on(device, output.advantages, output.weights, *(output.stage_masks or []))
    assert output.histograms and all(math.isfinite(value) for value in output.metrics.values())
    cpu = build_mechanism(BLOCKS[name]).process(1, batch(log_prob_dtype=torch.bfloat16), histograms=True)
    torch.testing.assert_close(output.advantages.cpu(), cpu.advantages)
    for key, value in cpu.metrics.items():
        assert output.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_field_on_another_device_is_refused(device):
    """With a GPU: a real CPU field beside CUDA ones. Without: a CPU tensor reporting ``cuda:0`` (the check reads
    metadata only)."""

    class ReportsCuda(torch.Tensor):
        @property
        def device(self):  # noqa: D401
            return torch.device("cuda", 0)

    fields = on(device, batch())
    if device == "cpu":
        fields["old_log_probs"] = fields["old_log_probs"].as_subclass(ReportsCuda)
        pattern = r"'old_log_probs' is on cuda:0, response_mask on cpu: every field must be on one device"
    else:
        fields["old_log_probs"] = fields["old_log_probs"].cpu()
        pattern = r"'old_log_probs' is on cpu, response_mask on cuda:0: every field must be on one device"
    with pytest.raises(ValueError, match=pattern):
        build_mechanism(AR).process(1, fields)


@contextlib.contextmanager
def counted_host_reads() -> Iterator[collections.Counter]:
    """Count every call of :data:`HOST_READS` on any tensor while the block runs."""
    counts: collections.Counter = collections.Counter()
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _name=name, _original=original, **kwargs):
                counts[_name] += 1
                return _original(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counted)
        yield counts


@pytest.mark.parametrize("histograms", [False, True], ids=["plain", "histograms"])
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_step_reads_the_host_once(device, name, histograms):
    mechanism = build_mechanism(BLOCKS[name])
    fields = on(device, batch(rows=64, length=512, log_prob_dtype=torch.bfloat16))  # over the quantile sample
    expected = mechanism.process(1, fields, histograms=histograms)  # also copies the histogram edges, once
    for step in (0, 1):  # 0: before warmup (warmup_step 1 below), 1: active
        mechanism.warmup_step = 1
        with counted_host_reads() as counts:
            output = mechanism.process(step, fields, histograms=histograms)
        assert counts == {"tolist": 1}, (step, counts)
    assert output.metrics == expected.metrics
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            mechanism.device_step(1, fields, histograms=histograms)  # raises at any synchronisation
        finally:
            torch.cuda.set_sync_debug_mode("default")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                mechanism.process(1, fields, histograms=histograms)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1, [str(w.message) for w in caught]


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_the_device_part_of_a_step_reads_no_value(name):
    """On the meta device every read of a value raises (``.item()``, ``nonzero``, boolean indexing, a 0-d index
    tensor): the part of a step before its one host read runs there, so it holds no hidden synchronisation."""
    fields = {name: value.to("meta") for name, value in batch().items()}
    mechanism = build_mechanism(BLOCKS[name])
    step = mechanism.device_step(1, fields, histograms=True)
    assert_on("meta", step.advantages, step.weights, *step.statistics.values(), *(step.stage_masks or []))
    before_warmup = build_mechanism({**BLOCKS[name], "warmup_step": 5}).device_step(1, fields, histograms=True)
    assert before_warmup.weights is None and before_warmup.stage_masks is None


def test_a_quantile_sample_without_valid_tokens_reads_them_all():
    """The rare fallback (a second host read): valid tokens only at positions the strided sample skips."""
    rows, length = 64, 512  # 32768 positions, stride 2 for a 16384 sample
    fields = batch(rows, length)
    fields["response_mask"] = (torch.arange(length) % 2 == 1).long().expand(rows, length)
    output = build_mechanism(AR).process(1, fields)
    valid = output.weights[fields["response_mask"] > 0]
    count = valid.numel()
    for q, name in ((0.05, "p05"), (0.5, "p50"), (0.95, "p95")):
        assert output.metrics[f"{keys.WEIGHT_PREFIX}/{name}"] == valid.kthvalue(int(q * (count - 1)) + 1).values
