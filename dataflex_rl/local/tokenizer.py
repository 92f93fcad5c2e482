"""Character-level tokenizer built in code (no download), and loading of a local HF tokenizer.

Both expose the small interface the local backend needs: ``encode``, ``decode``, ``pad_token_id``,
``eos_token_id``, ``bos_token_id``, ``vocab_size``, ``save_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

CHAR_TOKENIZER_FILE = "dataflex_char_tokenizer.json"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


class Tokenizer(Protocol):
    """What the trainer needs of a tokenizer: special-token ids, the vocabulary size, text <-> ids."""
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
        """Token ids of ``text`` (no special tokens added)."""
        try:
            return [self._ids[char] for char in text]
        except KeyError as error:
            raise ValueError(
                f"character {error.args[0]!r} is not in the tokenizer's alphabet {self.alphabet!r}"
            ) from None

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` up to the first ``<eos>``; special tokens are dropped."""
        characters = []
        for token in ids:
            if token == self.eos_token_id:
                break
            if token in self._chars:
                characters.append(self._chars[token])
        return "".join(characters)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the alphabet to ``directory`` (read back by :func:`load_tokenizer`)."""
        path = Path(directory) / CHAR_TOKENIZER_FILE
        path.write_text(json.dumps({"alphabet": self.alphabet, "special_tokens": list(SPECIAL_TOKENS)}))


class HFTokenizer:
    """A local Hugging Face tokenizer behind the same interface (for ``model.path=DIR``)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else self.pad_token_id
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` up to the first EOS, special tokens dropped."""
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def save_pretrained(self, directory: str | Path) -> None:
        """Hugging Face's own ``save_pretrained``."""
        self._tokenizer.save_pretrained(str(directory))


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer saved in ``directory``: a :class:`CharTokenizer` file, else a local HF tokenizer."""
    directory = Path(directory)
    char_file = directory / CHAR_TOKENIZER_FILE
    if char_file.exists():
        return CharTokenizer(json.loads(char_file.read_text())["alphabet"])
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
