"""The local CPU backend: a tiny causal LM, SFT warm start, and GRPO with the mechanism, all in one process.

verl cannot run end to end on a CPU (its rollout needs a vLLM/SGLang server); this backend runs the same
mechanism (:func:`dataflex_rl.build_mechanism`) and verl's own algorithm functions
(``verl.trainer.ppo.core_algos``: advantage estimators, policy losses, ``agg_loss``, KL) with an HF ``generate``
rollout, so a result on a laptop and on a cluster come from one implementation of the math.
"""
