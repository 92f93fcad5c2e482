"""The character-level tokenizer built in code, and a local HF tokenizer behind the same interface."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

CHAR_TOKENIZER_FILE = "dataflex_char_tokenizer.json"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


class Tokenizer(Protocol):
    pad_token_id: int
    eos_token_id: int
    bos_token_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` up to the first EOS, special tokens dropped."""

    def save_pretrained(self, directory: str | Path) -> None:
        """Write what :func:`load_tokenizer` reads back from ``directory``."""


class CharTokenizer:
    """One token per character of ``alphabet``, after the special tokens ``<pad>``, ``<bos>``, ``<eos>``."""

    def __init__(self, alphabet: str) -> None:
        characters = sorted(set(alphabet))
        if not characters:
            raise ValueError("CharTokenizer needs a non-empty alphabet")
        self.alphabet = "".join(characters)
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2
        self._ids = {char: index + len(SPECIAL_TOKENS) for index, char in enumerate(characters)}
        self._chars = {index: char for char, index in self._ids.items()}
        self.vocab_size = len(SPECIAL_TOKENS) + len(characters)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            raise ValueError(
                f"character {error.args[0]!r} is not in the tokenizer's alphabet {self.alphabet!r}"
            ) from None

    def decode(self, ids: list[int]) -> str:
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        return "".join(self._chars[token] for token in ids if token in self._chars)

    def save_pretrained(self, directory: str | Path) -> None:
        path = Path(directory) / CHAR_TOKENIZER_FILE
        path.write_text(json.dumps({"alphabet": self.alphabet, "special_tokens": list(SPECIAL_TOKENS)}))


class HFTokenizer:
    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else self.pad_token_id
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def save_pretrained(self, directory: str | Path) -> None:
        self._tokenizer.save_pretrained(str(directory))


def load_tokenizer(directory: str | Path) -> Tokenizer:
    directory = Path(directory)
    char_file = directory / CHAR_TOKENIZER_FILE
    if char_file.exists():
        return CharTokenizer(json.loads(char_file.read_text())["alphabet"])
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
