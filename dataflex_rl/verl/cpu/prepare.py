"""``python -m dataflex_rl.verl.cpu.prepare``: model, tokenizer and data folder of a CPU-mode run."""

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODEL_FOLDER = "model"
TOKENIZER_FOLDER = "tokenizer"
DATA_FOLDER = "data"
DONE_FILE = "done.json"
# The character tokenizer's chat template: <bos> then the messages' text, as encode_prompts encodes a prompt.
CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"


def hf_char_tokenizer(char_tokenizer: Any) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dataflex_rl.tinylm.tokenizer import SPECIAL_TOKENS

    vocabulary = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocabulary.update({char: char_tokenizer.encode(char)[0] for char in char_tokenizer.alphabet})
    backend = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    pad, bos, eos = SPECIAL_TOKENS
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=pad, bos_token=bos, eos_token=eos)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def prepare(out: Path, overrides: Sequence[str] = (), train_size: int = 4096, test_size: int = 256,
            seed: int = 0) -> Path:
    import torch

    from dataflex_rl.compose import compose_train_config
    from dataflex_rl.tinylm.sft import sft_cache_key, warm_start
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tracking.run_store.files import atomic_write_json
    from dataflex_rl.verl.data import build_rows, write_files

    train_config = parse_train_config(compose_train_config([*overrides, "run_dir=unused", "mode=sft"]))
    record = {"overrides": list(overrides), "train_size": train_size, "test_size": test_size, "seed": seed,
              "sft_key": sft_cache_key(train_config.model, train_config.task, train_config.sft)}
    done = out / DONE_FILE
    if done.exists():
        found = json.loads(done.read_text())
        if found == record:
            return out
        raise FileExistsError(f"--out = {str(out)!r} is not allowed: it was prepared from other inputs "
                              f"({found}); give another folder or delete this one")
    task = train_config.task.built
    rows = build_rows(train_config.task.name, train_config.task.params, train_size, test_size, seed=seed)
    threads = torch.get_num_threads()
    if train_config.threads is not None:  # as the local backend trains (conf/train.yaml: one thread)
        torch.set_num_threads(train_config.threads)
    try:
        model, tokenizer, _ = warm_start(train_config.model, train_config.task, train_config.sft, task)
    finally:
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    for folder in (MODEL_FOLDER, TOKENIZER_FOLDER):
        shutil.rmtree(out / folder, ignore_errors=True)
    model.save_pretrained(out / MODEL_FOLDER)
    hf_char_tokenizer(tokenizer).save_pretrained(out / TOKENIZER_FOLDER)
    write_files(rows, out / DATA_FOLDER)
    atomic_write_json(done, record)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from dataflex_rl.validation import ConfigError

    parser = argparse.ArgumentParser(prog="python -m dataflex_rl.verl.cpu.prepare",
                                     description="Write the model, tokenizer and data of a verl CPU-mode run.")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--train-size", type=int, default=4096, help="train rows")
    parser.add_argument("--test-size", type=int, default=256, help="held-out test rows")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train problems")
    parser.add_argument("overrides", nargs="*", help="local-backend overrides (task=..., sft.steps=..., model.*)")
    options = parser.parse_args(argv)
    # The SFT's progress lines ("SFT step i/n"), which a sweep's live view reads from this step's log.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("train_size", "test_size"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} = {getattr(options, name)} is not allowed: it must be >= 1")
    try:
        prepare(options.out, options.overrides, options.train_size, options.test_size, options.seed)
    except (ConfigError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"prepared {options.out}: {MODEL_FOLDER}/, {TOKENIZER_FOLDER}/, {DATA_FOLDER}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
