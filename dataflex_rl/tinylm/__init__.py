"""The tiny causal LM both backends train: model, tokenizer, decoder, sampler, batches, SFT (docs/performance.md)."""
