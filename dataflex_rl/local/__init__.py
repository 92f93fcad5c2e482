"""The local CPU backend: a tiny causal LM, SFT warm start, and GRPO with verl's algorithm functions."""
