"""A tiny actor for the verl tests: a model, verl-shaped rows, a stub of verl's actor worker group, and the paper's
actor loss restated (``dp_actor.update_policy`` of zhyang2226/AR-Lopti) to check its gradients against.

The stub keeps verl's own pieces: it reads a ``KVBatchMeta`` through verl's ``tqbridge`` (what every verl worker
method does; a TensorDict passes straight through), splits with verl's ``make_iterator`` and ``chunk_tensordict``,
sets verl's global batch info (``batch_num_tokens`` of the mini-batch, ``dp_size``) and calls the installed loss
function (verl's ``ppo_loss`` by default, as verl's worker builds it) on the tiny model's nested outputs.
"""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.transferqueue_utils import tqbridge
from verl.workers.utils.losses import ppo_loss

from dataflex_rl.verl.loss import STAGE_MASK_FIELD

VOCAB, HIDDEN = 13, 8
PROMPTS, GROUP = 2, 4  # GRPO groups: 2 prompts x 4 responses
LEARNING_RATE = 0.5  # large enough that the second stage sees a policy the first one moved
ENTROPY_COEFF = 0.01


# --- the tiny model and a verl-shaped batch -------------------------------------------------------------------------
class TinyLM(torch.nn.Module):
    """Next-token logits from the current token only (an embedding and a linear layer)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, VOCAB)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


def sequence_outputs(model: TinyLM, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position t of one sequence: log pi(ids[t + 1] | ids[:t + 1]) and the entropy there; 0 at the last
    position (verl's layout: ``no_padding_2_padding`` takes positions ``p - 1 .. p + r - 2`` for the response)."""
    log_softmax = torch.log_softmax(model(ids), dim=-1)
    next_log_probs = log_softmax[:-1].gather(-1, ids[1:, None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return torch.cat([next_log_probs, next_log_probs.new_zeros(1)]), torch.cat([entropy[:-1], entropy.new_zeros(1)])


def response_outputs(model: TinyLM, prompt: torch.Tensor, response: torch.Tensor):
    log_probs, entropy = sequence_outputs(model, torch.cat([prompt, response]))
    span = slice(len(prompt) - 1, len(prompt) + len(response) - 1)
    return log_probs[span], entropy[span]


def make_rows(seed: int, policy: TinyLM, reference: TinyLM) -> list[dict]:
    """Responses of 3-6 tokens after prompts of 2-3 tokens, one masked token in the long ones, 0/1 scores with
    both values in every group; ``old_log_probs`` from ``policy``, ``ref_log_prob`` from ``reference``."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for prompt_index in range(PROMPTS):
        prompt = torch.randint(0, VOCAB, (2 + prompt_index,), generator=generator)
        for member in range(GROUP):
            length = int(torch.randint(3, 7, (), generator=generator))
            response = torch.randint(0, VOCAB, (length,), generator=generator)
            mask = torch.ones(length, dtype=torch.int64)
            if length > 4:
                mask[1] = 0  # a token the policy did not generate (a tool response)
            with torch.no_grad():
                old, _ = response_outputs(policy, prompt, response)
                ref, _ = response_outputs(reference, prompt, response)
            rows.append({"uid": f"p{prompt_index}", "prompt": prompt, "response": response, "mask": mask,
                         "score": float(member % 2), "old": old, "ref": ref})
    return rows


def nested(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(values, layout=torch.jagged)


def batch_of(rows, advantages: torch.Tensor, stage_mask: torch.Tensor | None) -> TensorDict:
    """The TensorDict verl's worker gets for an update: nested response fields plus the trainer's extra_info."""
    lengths = [len(row["mask"]) for row in rows]
    fields = {
        "prompts": nested([row["prompt"] for row in rows]),
        "responses": nested([row["response"] for row in rows]),
        "input_ids": nested([torch.cat([row["prompt"], row["response"]]) for row in rows]),
        "response_mask": nested([row["mask"] for row in rows]),
        "old_log_probs": nested([row["old"] for row in rows]),
        "ref_log_prob": nested([row["ref"] for row in rows]),
        "advantages": nested([advantages[index, :length] for index, length in enumerate(lengths)]),
    }
    if stage_mask is not None:
        fields[STAGE_MASK_FIELD] = nested([stage_mask[index, :length].long() for index, length in enumerate(lengths)])
    data = TensorDict(fields, batch_size=len(rows))
    tu.assign_non_tensor(data, mini_batch_size=len(rows), epochs=1, seed=1, dataloader_kwargs={"shuffle": False},
                         global_batch_size=len(rows), calculate_entropy=True)
    return data



# --- the stub worker group ------------------------------------------------------------------------------------------
class StubActorWorkerGroup:
    """verl's actor worker group on one CPU rank: ``set_loss_fn`` and ``update_actor`` (see the module docstring).

    Records, per ``update_actor`` call, the padded advantages and stage mask it read back from TransferQueue, the
    parameters before the optimiser step and the gradient the loss gave (one mini-batch, two micro-batches).
    """

    def __init__(self, model: TinyLM, actor_config) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        self.loss_fn = partial(ppo_loss, config=actor_config)  # what verl's worker builds in init_model
        self.calls: list[dict] = []
        # verl wraps every worker method in tqbridge: a KVBatchMeta argument becomes the TensorDict it names.
        self.update_actor = tqbridge()(self._train_mini_batch)

    def set_loss_fn(self, loss_fn) -> None:
        self.loss_fn = loss_fn

    def _train_mini_batch(self, data: TensorDict) -> dict:
        record = {
            "advantages": data.select("advantages").to_padded_tensor()["advantages"],
            "stage_mask": (data.select(STAGE_MASK_FIELD).to_padded_tensor()[STAGE_MASK_FIELD]
                           if STAGE_MASK_FIELD in data.keys() else None),
            "params": copy.deepcopy(self.model.state_dict()),
        }
        mini_batch_size = tu.pop(data, "mini_batch_size")
        epochs = tu.pop(data, "epochs")
        assert (mini_batch_size, epochs) == (len(data), 1)  # the config below: one mini-batch, one epoch
        metrics: dict[str, list[float]] = {"pg_loss": [], "kl_loss": []}
        for mini_batch in tu.make_iterator(data, mini_batch_size=mini_batch_size, epochs=epochs, seed=tu.pop(data, "seed"),
                                           dataloader_kwargs=tu.pop(data, "dataloader_kwargs")):
            # verl's engine: tokens of the whole mini-batch (over data-parallel ranks) normalise every micro-batch.
            tu.assign_non_tensor(mini_batch, batch_num_tokens=int(mini_batch["response_mask"].values().sum()),
                                 dp_size=1)
            self.optimizer.zero_grad()
            for micro_batch in tu.chunk_tensordict(mini_batch, 2):
                loss, loss_metrics = self.loss_fn(model_output=self._forward(micro_batch), data=micro_batch)
                loss.backward()
                metrics["pg_loss"].append(float(loss_metrics["actor/pg_loss"].aggregate()))
                if "kl_loss" in loss_metrics:
                    metrics["kl_loss"].append(float(loss_metrics["kl_loss"].aggregate()))
            record["grads"] = [parameter.grad.clone() for parameter in self.model.parameters()]
            self.optimizer.step()
        self.calls.append(record)
        return {"metrics": {"pg_loss": sum(metrics["pg_loss"]), "kl_loss": sum(metrics["kl_loss"]),
                            "grad_norm": float(torch.cat([g.flatten() for g in record["grads"]]).norm()),
                            "mfu": 0.0}}

    def _forward(self, micro_batch: TensorDict) -> dict:
        """The engine's model output: nested per-sequence next-token log-probs (and entropy when asked)."""
        outputs = [sequence_outputs(self.model, ids) for ids in micro_batch["input_ids"].unbind()]
        offsets = micro_batch["input_ids"].offsets()
        output = {"log_probs": torch.nested.nested_tensor_from_jagged(torch.cat([o[0] for o in outputs]), offsets)}
        if tu.get_non_tensor_data(micro_batch, "calculate_entropy", False):
            output["entropy"] = torch.nested.nested_tensor_from_jagged(torch.cat([o[1] for o in outputs]), offsets)
        return output


# --- the restated paper loss ----------------------------------------------------------------------------------------
def padded(rows: list[dict], name: str) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([row[name].float() for row in rows], batch_first=True)


def paper_gradient(model: TinyLM, params: dict, rows: list[dict], advantages: torch.Tensor,
                   stage_mask: torch.Tensor, config, mask_regularisers: bool = True) -> list[torch.Tensor]:
    """The gradient of the paper's actor loss at ``params`` (see the module docstring); with
    ``mask_regularisers=False``, verl's plain ``ppo_loss`` (KL and entropy over every token) instead."""
    model = copy.deepcopy(model)
    model.load_state_dict(params)
    outputs = [response_outputs(model, row["prompt"], row["response"]) for row in rows]
    log_prob = torch.nn.utils.rnn.pad_sequence([o[0] for o in outputs], batch_first=True)
    entropy = torch.nn.utils.rnn.pad_sequence([o[1] for o in outputs], batch_first=True)
    response_mask = padded(rows, "mask") > 0
    regulariser_mask = (stage_mask & response_mask) if mask_regularisers else response_mask
    tokens = response_mask.sum()
    ratio = torch.exp(torch.clamp(log_prob - padded(rows, "old"), -20.0, 20.0))
    clipped = torch.maximum(-advantages * ratio,
                            -advantages * torch.clamp(ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high))
    dual_clipped = torch.minimum(-advantages * config.clip_ratio_c, clipped)
    pg = torch.where(advantages < 0, dual_clipped, clipped)
    log_ratio = torch.clamp(padded(rows, "ref") - log_prob, -20.0, 20.0)
    low_var_kl = torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -10.0, 10.0)
    loss = ((pg * response_mask).sum() - ENTROPY_COEFF * (entropy * regulariser_mask).sum()
            + config.kl_loss_coef * (low_var_kl * regulariser_mask).sum()) / tokens
    return list(torch.autograd.grad(loss, list(model.parameters())))


def grpo_advantages(rows: list[dict]) -> torch.Tensor:
    """GRPO's outcome advantage, restated: (score - group mean) / (group std + 1e-6), on every response token."""
    scores = torch.tensor([row["score"] for row in rows])
    groups = np.array([row["uid"] for row in rows])
    normalised = torch.empty_like(scores)
    for uid in set(groups):
        members = torch.from_numpy(groups == uid)
        normalised[members] = (scores[members] - scores[members].mean()) / (scores[members].std() + 1e-6)
    return normalised[:, None] * padded(rows, "mask")
