"""verl's actor loss with per-stage KL and entropy terms, for staged mechanisms (Lopti)."""

import dataclasses
from typing import Any

from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
from verl.utils.metric import Metric
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

# Jagged (bs, j) like response_mask: 1 on the response tokens the current update stage owns, 0 elsewhere.
STAGE_MASK_FIELD = "dataflex_stage_mask"


def staged_ppo_loss(config: Any, model_output: Any, data: TensorDict, dp_group: Any = None) -> tuple[Any, dict]:
    if STAGE_MASK_FIELD not in data.keys():
        return ppo_loss(config, model_output, data, dp_group)
    without_entropy = {name: value for name, value in model_output.items() if name != "entropy"}
    # verl's loss without its KL term (added below over the stage's tokens); the copy shares global_batch_info.
    policy_loss, metrics = ppo_loss(dataclasses.replace(config, use_kl_loss=False), without_entropy, data,
                                    dp_group)
    entropy = model_output.get("entropy", None)
    if entropy is None and not config.use_kl_loss:
        return policy_loss, metrics
    aggregation = metrics["actor/pg_loss"].aggregation  # ppo_loss's choice (SUM under global normalisation)
    fields = ["response_mask", STAGE_MASK_FIELD] + (["ref_log_prob"] if config.use_kl_loss else [])
    padded = data.select(*fields).to_padded_tensor()
    response_mask = padded["response_mask"].to(bool)
    stage_mask = padded[STAGE_MASK_FIELD].to(bool) & response_mask
    batch_info = config.global_batch_info  # set by the ppo_loss call above
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
        entropy_loss = agg_loss(
            loss_mat=entropy * stage_mask, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **batch_info
        )
        policy_loss = policy_loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=aggregation)
    if config.use_kl_loss:
        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        kld = kl_penalty(logprob=log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(
            loss_mat=kld * stage_mask, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **batch_info
        )
        policy_loss = policy_loss + kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss, aggregation=aggregation)
        metrics["kl_coef"] = config.kl_loss_coef
    return policy_loss, metrics
