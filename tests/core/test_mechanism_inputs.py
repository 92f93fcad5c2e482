"""The mechanism refuses what it would get wrong, naming the field; eager and compiled agree on what it accepts."""

from __future__ import annotations

import pytest
import torch

from dataflex_rl import build_mechanism


def make_config(alpha=0.5):
    return {
        "mechanism": "reweight",
        "scorer": {"name": "token_prob"},
        "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha}},
        "warmup_step": 0,
    }


def good_fields() -> dict[str, torch.Tensor]:
    return {
        "old_log_probs": torch.tensor([[0.5, 0.25, 0.125]]).log(),
        "response_mask": torch.tensor([[1, 1, 0]]),
        "advantages": torch.tensor([[1.0, 2.0, 3.0]]),
    }


def changed(**fields) -> dict[str, torch.Tensor]:
    return {**good_fields(), **fields}


BAD_INPUTS = {
    # int64 advantages were truncated: [[1, 2, 3]] came back [[0, 2, 3]] at alpha 0.5
    "int advantages": (changed(advantages=torch.tensor([[1, 2, 3]])), TypeError, r"'advantages' has dtype torch\.int64"),
    "int log-probs": (changed(old_log_probs=torch.tensor([[-1, -2, -3]])), TypeError,
                      r"'old_log_probs' has dtype torch\.int64"),
    "NaN advantage": (changed(advantages=torch.tensor([[1.0, float("nan"), 3.0]])), ValueError,
                      r"'advantages' has 1 NaN or infinite value\(s\) on valid tokens; first .*\(0, 1\)"),
    "inf advantage": (changed(advantages=torch.tensor([[float("inf"), 2.0, 3.0]])), ValueError,
                      r"'advantages' has 1 NaN or infinite"),
    "mask 0.5": (changed(response_mask=torch.tensor([[1.0, 0.5, 0.0]])), ValueError,
                 r"'response_mask' has 1 value\(s\) other than 0 and 1; first .*\(0, 1\): 0\.5"),
    "mask -1": (changed(response_mask=torch.tensor([[1, -1, 0]])), ValueError, r"'response_mask' has 1 value"),
    "mask NaN": (changed(response_mask=torch.tensor([[1.0, float("nan"), 0.0]])), ValueError,
                 r"'response_mask' has 1 value"),
    "1-D fields": ({name: value[0] for name, value in good_fields().items()}, ValueError,
                   r"has 1 dimension\(s\) \(shape \(3,\)\); every field is 2-D"),
    "3-D advantages": (changed(advantages=torch.ones(1, 3, 1)), ValueError, r"'advantages' has 3 dimension"),
    "meta device": (changed(advantages=torch.ones(1, 3, device="meta")), ValueError,
                    r"'advantages' is on the meta device"),
}


@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_are_refused_naming_the_field(case, compile_):
    fields, error, message = BAD_INPUTS[case]
    mechanism = build_mechanism(make_config(), compile=compile_)
    with pytest.raises(error, match=message):
        mechanism.apply(1, fields)


def test_a_field_on_another_device_is_refused():
    class OtherDevice(torch.Tensor):
        """A CPU tensor reporting another device: the check reads metadata only, so no accelerator is needed."""

        @property
        def device(self):  # noqa: D401
            return torch.device("cuda", 0)

    fields = changed(advantages=torch.tensor([[1.0, 2.0, 3.0]]).as_subclass(OtherDevice))
    with pytest.raises(ValueError, match=r"'advantages' is on cuda:0, response_mask on cpu"):
        build_mechanism(make_config()).apply(1, fields)


def test_nan_advantages_at_masked_positions_are_accepted_and_passed_through():
    fields = changed(advantages=torch.tensor([[1.0, 2.0, float("nan")]]))
    advantages, _ = build_mechanism(make_config()).apply(1, fields)
    assert torch.isnan(advantages[0, 2]) and torch.isfinite(advantages[0, :2]).all()


def random_fields(generator: torch.Generator, rows: int, length: int, mask_dtype: torch.dtype,
                  advantage_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    mask = torch.rand(rows, length, generator=generator) > 0.3
    mask[:, 0] = True  # every row has a valid token
    return {
        "old_log_probs": -torch.rand(rows, length, generator=generator) * 6,
        "response_mask": mask.to(mask_dtype),
        "advantages": (torch.randn(rows, length, generator=generator) * 2).to(advantage_dtype),
    }


def test_eager_and_compiled_agree_on_random_valid_inputs():
    generator = torch.Generator().manual_seed(11)
    eager = build_mechanism(make_config(alpha=0.7))
    compiled = build_mechanism(make_config(alpha=0.7), compile=True)
    # Every mask dtype a backend hands over (bool: local, int64: verl, float) at several shapes; each dtype pair
    # compiles once (dynamic shapes), so bfloat16 advantages get one pair only.
    cases = [(rows, length, mask_dtype, torch.float32)
             for mask_dtype in (torch.bool, torch.int64, torch.float32)
             for rows, length in ((1, 1), (3, 17), (8, 64))]
    cases += [(rows, length, torch.float32, torch.bfloat16) for rows, length in ((2, 5), (8, 64))]
    for rows, length, mask_dtype, advantage_dtype in cases:
        fields = random_fields(generator, rows, length, mask_dtype, advantage_dtype)
        expected, expected_metrics = eager.apply(1, fields)
        got, got_metrics = compiled.apply(1, fields)
        label = f"{rows}x{length} mask {mask_dtype} advantages {advantage_dtype}"
        assert got.dtype == expected.dtype == advantage_dtype, label
        tolerance = {"rtol": 1e-2, "atol": 1e-2} if advantage_dtype == torch.bfloat16 else {}
        torch.testing.assert_close(got, expected, **tolerance, msg=label)
        for key, value in expected_metrics.items():
            assert got_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (label, key)


def test_eager_and_compiled_agree_for_the_staged_lopti_mechanism():
    config = {"mechanism": "isolate", "scorer": {"name": "token_prob"},
              "actuator": {"name": "lopti", "params": {"eta": 0.5, "alpha": 0.5}}, "warmup_step": 0}
    generator = torch.Generator().manual_seed(12)
    eager, compiled = build_mechanism(config), build_mechanism(config, compile=True)
    for mask_dtype in (torch.bool, torch.float32):
        fields = random_fields(generator, 6, 40, mask_dtype, torch.float32)
        expected, got = eager.process(1, fields), compiled.process(1, fields)
        torch.testing.assert_close(got.advantages, expected.advantages)
        assert all(torch.equal(a, b) for a, b in zip(got.stage_masks, expected.stage_masks, strict=True))
        for key, value in expected.metrics.items():
            assert got.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
