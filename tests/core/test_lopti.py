"""Lopti (mechanism ``isolate``, actuator ``lopti``): stage masks, eta edge cases, AR inside, presets.

The paper code's split (arXiv:2505.12929; ``seperate_prob`` in ``verl/trainer/ppo/ray_trainer.py`` of the authors'
AR-Lopti repository), restated: ``first = exp(old_log_probs) < eta`` for ``eta > 0`` and
``first = exp(old_log_probs) >= -eta`` for ``eta < 0``; the first update sees ``where(first, A, 0)``, the second
``where(first, 0, A)``, with ``A`` the (reweighted) advantages.

Its quantile split (``seperate_portion``, used when ``seperate_prob == 0``), restated::

    real_probs = exp(old_log_probs) * attention_mask;  real_probs = real_probs[real_probs > 0]
    q = torch.quantile(real_probs, |portion|)
    first = exp(old_log_probs) < q  (portion > 0)   |   first = exp(old_log_probs) >= q  (portion < 0)

Here ``split: quantile`` with ``eta = portion``.
"""

import dataclasses
import math
import pathlib

import pytest
import torch
from omegaconf import OmegaConf

from dataflex_rl import ConfigError, build_mechanism, keys, parse_dataflex_config
from dataflex_rl.actuators import ACTUATORS
from dataflex_rl.compose import CONF_DIR, compose_train_config
from dataflex_rl.dataflex_block import dataflex_defaults
from dataflex_rl.scorers import SCORERS
from tests.core.devices import on, on_cpu, processed


def lopti_config(eta=0.5, alpha=0.0, normalize="mean", warmup_step=0, **extra):
    return {
        "mechanism": "isolate",
        "scorer": {"name": "token_prob"},
        "actuator": {"name": "lopti", "params": {"eta": eta, "alpha": alpha, "normalize": normalize, **extra}},
        "warmup_step": warmup_step,
    }


def hand_fields():
    """pi = (0.1, 0.5, 0.75 | 0.25, 1.0, pad): exp(log(p)) gives back these p exactly in float32."""
    return {
        "old_log_probs": torch.tensor([[0.1, 0.5, 0.75], [0.25, 1.0, 1.0]]).log(),
        "response_mask": torch.tensor([[True, True, True], [True, True, False]]),
        "advantages": torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 7.0]]),
    }


def random_fields(seed, rows=8, length=17):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, length, generator=generator) > 0.2
    log_probs = -torch.rand(rows, length, generator=generator) * 3
    log_probs[0, :3] = 0.0  # some tokens with pi exactly 1
    return {
        "old_log_probs": log_probs,
        "response_mask": mask,
        "advantages": torch.where(mask, torch.randn(rows, length, generator=generator), 0.0),
    }


def paper_stage_advantages(advantages, old_log_probs, eta):
    """The paper's two stage advantages (see the module docstring)."""
    first = torch.exp(old_log_probs) < eta if eta > 0 else torch.exp(old_log_probs) >= -eta
    return [torch.where(first, advantages, 0.0), torch.where(first, 0.0, advantages)]


def stage_advantages(output):
    return [torch.where(mask, output.advantages, 0.0) for mask in output.stage_masks]


# --- stage masks ----------------------------------------------------------------------------------------------------
def test_hand_derived_stage_masks_low_first(device):
    # eta = 0.5: low = pi < 0.5 = {0.1, 0.25}; 0.5 itself is not below eta; the padded slot is in neither stage.
    output = processed(device, lopti_config(eta=0.5), 0, hand_fields())
    low = torch.tensor([[True, False, False], [True, False, False]])
    high = torch.tensor([[False, True, True], [False, True, False]])
    assert len(output.stage_masks) == 2
    assert torch.equal(output.stage_masks[0], low) and torch.equal(output.stage_masks[1], high)
    assert output.metrics[keys.LOPTI_LOW_TOKEN_FRAC] == pytest.approx(2 / 5)
    assert torch.equal(output.advantages, hand_fields()["advantages"])  # alpha = 0: advantages unchanged


def test_negative_eta_reverses_the_order_at_its_magnitude(device):
    # eta = -0.5: the tokens with pi >= 0.5 first, then pi < 0.5; the low-group share is the same.
    output = processed(device, lopti_config(eta=-0.5), 0, hand_fields())
    assert torch.equal(output.stage_masks[0], torch.tensor([[False, True, True], [False, True, False]]))
    assert torch.equal(output.stage_masks[1], torch.tensor([[True, False, False], [True, False, False]]))
    assert output.metrics[keys.LOPTI_LOW_TOKEN_FRAC] == pytest.approx(2 / 5)


def test_eta_one_puts_all_but_certain_tokens_first(device):
    # eta = 1: pi < 1 holds for every token but the one with pi exactly 1, which forms the second stage.
    output = processed(device, lopti_config(eta=1.0), 0, hand_fields())
    assert torch.equal(output.stage_masks[0], torch.tensor([[True, True, True], [True, False, False]]))
    assert torch.equal(output.stage_masks[1], torch.tensor([[False, False, False], [False, True, False]]))
    assert output.metrics[keys.LOPTI_LOW_TOKEN_FRAC] == pytest.approx(4 / 5)
    # eta = -1: the certain token first (pi >= 1), then the rest.
    reverse = processed(device, lopti_config(eta=-1.0), 0, hand_fields())
    assert torch.equal(reverse.stage_masks[0], output.stage_masks[1])
    assert torch.equal(reverse.stage_masks[1], output.stage_masks[0])


def test_an_empty_stage_is_kept(device):
    # eta = 0.05: no token is that unlikely, so the first stage is empty; both stages still run (the paper's code
    # always updates twice).
    output = processed(device, lopti_config(eta=0.05), 0, hand_fields())
    assert not output.stage_masks[0].any()
    assert torch.equal(output.stage_masks[1], hand_fields()["response_mask"])
    assert output.metrics[keys.LOPTI_LOW_TOKEN_FRAC] == 0.0


@pytest.mark.parametrize("eta", [0.5, 0.3, 1.0, -0.5, -0.3, -1.0, 0.01])
def test_stages_partition_the_valid_tokens_and_match_the_paper(device, eta):
    fields = random_fields(7)
    output = processed(device, lopti_config(eta=eta), 3, fields)
    first, second = output.stage_masks
    valid = fields["response_mask"]
    assert not (first & second).any()
    assert torch.equal(first | second, valid)
    # The paper's split on the same device (exp may round differently on another one).
    on_device = on(device, fields)
    for ours, theirs in zip(stage_advantages(output), paper_stage_advantages(on_device["advantages"],
                                                                              on_device["old_log_probs"], eta)):
        assert torch.equal(ours, theirs.cpu())


@pytest.mark.parametrize(
    ("eta", "pattern"),
    [
        (0.0, r"dataflex\.actuator\.params\.eta = 0\.0 is not allowed: it must be in \[-1, 0\) or \(0, 1\]"),
        (0, r"eta = 0 is not allowed"),
        (1.5, r"eta = 1\.5 is not allowed: it must be in \[-1, 0\) or \(0, 1\]"),
        (-1.01, r"eta = -1\.01 is not allowed"),
        (math.nan, r"eta = nan is not allowed: it must be a finite number"),
        (True, r"eta = True is not allowed"),
        ("0.5", r"eta = '0\.5' is not allowed"),
    ],
)
def test_bad_eta_is_refused(eta, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_mechanism(lopti_config(eta=eta))


# --- warmup, composition with AR ------------------------------------------------------------------------------------
def test_before_warmup_no_stages_and_unchanged_advantages(device):
    fields = random_fields(8)
    mechanism = build_mechanism(lopti_config(alpha=0.7, warmup_step=5))
    before = on_cpu(device, mechanism.process(4, on(device, fields)))
    assert before.stage_masks is None and before.weights is None
    assert torch.equal(before.advantages, fields["advantages"])
    assert keys.LOPTI_LOW_TOKEN_FRAC not in before.metrics and before.metrics[keys.ACTIVE] == 0.0
    after = on_cpu(device, mechanism.process(5, on(device, fields)))
    assert after.stage_masks is not None and after.metrics[keys.ACTIVE] == 1.0


def test_pure_lopti_keeps_advantages_bit_for_bit(device):
    fields = random_fields(9)
    output = processed(device, lopti_config(eta=0.4), 0, fields)
    assert torch.equal(output.advantages, fields["advantages"])
    # Summed over the stages, each token's advantage is applied exactly once.
    assert torch.equal(sum(stage_advantages(output)), fields["advantages"])


@pytest.mark.parametrize("normalize", ["mean", "none"])
def test_ar_lopti_applies_the_ar_weights_inside_each_stage(device, normalize):
    fields = random_fields(10)
    ar_params = {"alpha": 0.3, "normalize": normalize, "tau": 0.7, "neg_adv_weight": 0.9}
    ar = processed(device, {"mechanism": "reweight", "actuator": {"name": "advantage_reweight", "params": ar_params}},
                   0, fields)
    staged = processed(device, lopti_config(eta=0.5, **ar_params), 0, fields)
    assert torch.equal(staged.advantages, ar.advantages)
    assert torch.equal(staged.weights, ar.weights)
    assert not torch.equal(staged.advantages, fields["advantages"])
    for ours, theirs in zip(stage_advantages(staged), paper_stage_advantages(
            ar.advantages.to(device), on(device, fields)["old_log_probs"], 0.5)):
        assert torch.equal(ours, theirs.cpu())


def test_ar_lopti_hand_derived(device):
    # alpha = 0.5, normalize: none -> w = 0.5 pi + 0.5: (0.55, 0.75, 0.875 | 0.625, 1.0); eta = 0.5.
    fields = hand_fields()
    output = processed(device, lopti_config(eta=0.5, alpha=0.5, normalize="none"), 0, fields)
    first, second = stage_advantages(output)
    torch.testing.assert_close(first, torch.tensor([[0.55, 0.0, 0.0], [-1.25, 0.0, 0.0]]))
    torch.testing.assert_close(second, torch.tensor([[0.0, 0.75, 0.875], [0.0, -2.0, 0.0]]))
    assert output.advantages[1, 2] == 7.0  # the padded slot passes through, in no stage


# --- config ---------------------------------------------------------------------------------------------------------
def test_isolate_defaults_to_the_lopti_actuator():
    parsed = parse_dataflex_config({"mechanism": "isolate"})
    assert parsed.actuator.name == "lopti"
    assert dict(parsed.actuator.params) == {"alpha": 0.0, "normalize": "mean", "tau": None, "neg_adv_weight": 1.0,
                                            "eta": 0.5, "split": "threshold"}
    assert build_mechanism({"mechanism": "isolate"}).staged


def test_mismatched_mechanism_and_actuator_are_refused():
    with pytest.raises(ConfigError, match=r"dataflex\.actuator\.name = 'advantage_reweight' cannot drive "
                                          r"dataflex\.mechanism = 'isolate'; allowed actuators: \['lopti'\]"):
        build_mechanism({"mechanism": "isolate", "actuator": {"name": "advantage_reweight"}})
    with pytest.raises(ConfigError, match=r"dataflex\.actuator\.name = 'lopti' cannot drive dataflex\.mechanism = "
                                          r"'reweight': it splits the policy update in stages.*isolate"):
        build_mechanism({"mechanism": "reweight", "actuator": {"name": "lopti"}})


def compose_dataflex(overrides):
    return compose_train_config(overrides)["dataflex"]


@pytest.mark.parametrize(
    ("preset", "mechanism", "alpha", "staged"),
    [("baseline", "reweight", 0.0, False), ("ar", "reweight", 0.5, False),
     ("lopti", "isolate", 0.0, True), ("ar_lopti", "isolate", 0.5, True)],
)
def test_the_four_presets_build(preset, mechanism, alpha, staged):
    built = build_mechanism(compose_dataflex([f"dataflex={preset}"]))
    assert built.config.mechanism == mechanism
    assert built.config.actuator.params["alpha"] == alpha
    assert (built.process(0, random_fields(11)).stage_masks is not None) == staged


@pytest.mark.parametrize("preset", ["lopti", "ar_lopti"])
def test_alpha_and_eta_override_the_staged_presets(preset):
    for prefix in ("", "++"):  # as written by hand, and as the sweep driver writes them
        block = compose_dataflex([f"dataflex={preset}", f"{prefix}dataflex.actuator.params.alpha=0.25",
                                  f"{prefix}dataflex.actuator.params.eta=-0.3"])
        params = build_mechanism(block).config.actuator.params
        assert params["alpha"] == 0.25 and params["eta"] == -0.3


def test_alpha_overrides_baseline_and_eta_is_refused_there():
    assert build_mechanism(compose_dataflex(["dataflex=baseline", "dataflex.actuator.params.alpha=0.25"])) \
        .config.actuator.params["alpha"] == 0.25
    block = compose_dataflex(["dataflex=baseline", "++dataflex.actuator.params.eta=0.3"])
    with pytest.raises(ConfigError, match=r"dataflex\.actuator\.params: unknown key\(s\) 'eta'"):
        build_mechanism(block)


def test_presets_hold_what_differs_and_compose_to_the_public_block_shape():
    defaults = dataflex_defaults()
    for path in sorted(pathlib.Path(CONF_DIR, "dataflex").glob("*.yaml")):
        preset = OmegaConf.to_container(OmegaConf.load(path))
        restated = [key for key in ("mechanism", "warmup_step") if preset.get(key) == defaults[key]]
        scorer = preset.get("scorer") or {}
        restated += ["scorer"] * (scorer.get("name") == defaults["scorer"]["name"] or scorer.get("params") == {})
        for component, registry in (("scorer", SCORERS), ("actuator", ACTUATORS)):
            params = (preset.get(component) or {}).get("params") or {}
            fields = {field.name: field.default for field in dataclasses.fields(registry.get(
                (preset.get(component) or defaults[component])["name"]).Params)}
            restated += [f"{component}.params.{key}" for key, value in params.items() if fields[key] == value]
        assert restated == [], path.name
        composed = compose_dataflex([f"dataflex={path.stem}"])
        assert set(composed) == {"mechanism", "scorer", "actuator", "warmup_step"}
        assert composed == build_mechanism(composed).config.to_dict(), f"{path.name}: the record misses a value"


# --- quantile split (the paper code's seperate_portion) -------------------------------------------------------------
def paper_portion_stage_advantages(advantages, old_log_probs, response_mask, portion):
    """The paper code's ``seperate_portion`` branch (module docstring), on valid tokens."""
    real_probs = torch.exp(old_log_probs) * response_mask
    real_probs = real_probs[real_probs > 0]
    threshold = torch.quantile(real_probs, abs(portion), dim=0, keepdim=True)
    first = torch.exp(old_log_probs) < threshold if portion > 0 else torch.exp(old_log_probs) >= threshold
    first = first & response_mask  # their padding has advantage 0; ours is outside both stages
    return [torch.where(first, advantages, 0.0), torch.where(response_mask & ~first, advantages, 0.0)], threshold


def test_hand_derived_quantile_split(device):
    # Valid pi = 0.1, 0.5, 0.75, 0.25, 1.0; sorted 0.1, 0.25, 0.5, 0.75, 1.0. eta = 0.5: rank 0.5 * 4 = 2 -> q = 0.5,
    # so the low group is pi < 0.5 = {0.1, 0.25}. eta = 0.3: rank 1.2 -> q = 0.25 + 0.2 * (0.5 - 0.25) = 0.3.
    output = processed(device, lopti_config(eta=0.5, split="quantile"), 0, hand_fields())
    assert torch.equal(output.stage_masks[0], torch.tensor([[True, False, False], [True, False, False]]))
    assert output.metrics[keys.LOPTI_THRESHOLD] == pytest.approx(0.5)
    output = processed(device, lopti_config(eta=0.3, split="quantile"), 0, hand_fields())
    assert output.metrics[keys.LOPTI_THRESHOLD] == pytest.approx(0.3)
    assert torch.equal(output.stage_masks[0], torch.tensor([[True, False, False], [True, False, False]]))
    # The threshold split reports |eta| as its threshold.
    output = processed(device, lopti_config(eta=-0.4), 0, hand_fields())
    assert output.metrics[keys.LOPTI_THRESHOLD] == pytest.approx(0.4)


@pytest.mark.parametrize("eta", [0.2, 0.5, 0.8, 1.0, -0.3, -1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantile_split_equals_the_paper_code(device, eta, seed):
    fields = random_fields(seed, rows=16, length=33)
    fields["old_log_probs"][1, :4] = -200.0  # pi underflows to 0: left out of the quantile, as theirs does
    output = processed(device, lopti_config(eta=eta, split="quantile"), 0, fields)
    on_device = on(device, fields)
    expected, threshold = paper_portion_stage_advantages(
        on_device["advantages"], on_device["old_log_probs"], on_device["response_mask"], eta)
    for ours, theirs in zip(stage_advantages(output), expected, strict=True):
        assert torch.equal(ours, theirs.cpu())
    assert output.metrics[keys.LOPTI_THRESHOLD] == float(threshold)


def test_quantile_split_puts_the_share_eta_in_the_low_group(device):
    # 1000 distinct probabilities: eta = 0.3 puts 0.3 of the valid tokens first (up to one token).
    pi = torch.linspace(0.001, 0.999, 1000).reshape(10, 100)
    fields = {"old_log_probs": pi.log(), "response_mask": torch.ones(10, 100, dtype=torch.bool),
              "advantages": torch.ones(10, 100)}
    output = processed(device, lopti_config(eta=0.3, split="quantile"), 0, fields)
    assert abs(output.metrics[keys.LOPTI_LOW_TOKEN_FRAC] - 0.3) <= 1 / 1000


def test_quantile_split_without_valid_tokens_puts_nothing_in_the_low_group(device):
    fields = hand_fields()
    fields["response_mask"] = torch.zeros_like(fields["response_mask"])
    output = processed(device, lopti_config(eta=0.5, split="quantile"), 0, fields)
    assert not output.stage_masks[0].any() and not output.stage_masks[1].any()


def test_unknown_split_is_refused():
    with pytest.raises(ConfigError, match="split = 'median' is not allowed; allowed values: 'threshold', 'quantile'"):
        build_mechanism(lopti_config(split="median"))
