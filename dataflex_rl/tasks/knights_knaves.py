"""Knights-and-Knaves puzzles: generator, bitmask solver, ``compact`` and ``chat`` renderings with their parsers,
rewards and the task (docs/knights_knaves.md#the-task)."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import random
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dataflex_rl.tasks.base import TASKS, Problem, Task
from dataflex_rl.validation import check_choice, check_int_in_range, check_non_negative_int

TASK_NAME = "knights_knaves"
COMPACT_TERMINATOR = ";"
RENDERINGS = ("compact", "chat")
REWARDS = ("binary", "logic_rl")
MIN_PEOPLE = 2
MAX_PEOPLE = 12  # 2^12 assignments per bitmask; letters A..L in the compact rendering
# Depth 1 never has a unique solution: swapping every knight with a knave preserves "X == Y" and "X != Y".
MIN_DEPTH = 2
MAX_DEPTH_LIMIT = 5
MAX_WIDTH_LIMIT = 4
LETTERS = string.ascii_uppercase
LEAF_KINDS = ("knight", "knave")
STATEMENT_KINDS = ("knight", "knave", "not", "and", "or", "iff", "implies")
_NODE_KINDS = ("leaf", "not", "and", "or", "implies", "iff")
NAMES = (
    "Zoey", "Oliver", "Ethan", "Mia", "Liam", "Emma", "Noah", "Ava", "Lucas", "Sophia",
    "Mason", "Isabella", "Logan", "Harper", "James", "Amelia", "Benjamin", "Evelyn", "Henry", "Abigail",
    "Jacob", "Emily", "Michael", "Elizabeth", "Daniel", "Sofia", "Jackson", "Avery", "Sebastian", "Ella",
    "Aiden", "Scarlett", "Matthew", "Grace", "Samuel", "Chloe", "David", "Victoria", "Joseph", "Riley",
)  # fmt: skip
# The verl reward kwarg choosing the reward (reward.custom_reward_function.reward_kwargs.knights_knaves_reward).
VERL_REWARD_OPTION = "knights_knaves_reward"
# Draws without a uniquely solvable puzzle (or without a new distinct one) after which generation gives up.
PUZZLE_PATIENCE = 20_000

Statement = tuple[Any, ...]


# --- puzzles ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Puzzle:
    """``statements`` holds ``(speaker, statement)`` pairs; ``solution[i]`` is True for a knight."""

    names: tuple[str, ...]
    statements: tuple[tuple[int, Statement], ...]
    solution: tuple[bool, ...]

    @property
    def num_people(self) -> int:
        return len(self.names)

    @property
    def key(self) -> str:
        """Canonical identity: the compact prompt (independent of names)."""
        return render_compact_prompt(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the ground truth of verl rows and ``Problem.answer``); :meth:`from_dict` inverts it."""
        return {"num_people": self.num_people,
                "names": list(self.names),
                "statements": [[speaker, statement_to_dict(statement)] for speaker, statement in self.statements],
                "solution": list(self.solution)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Puzzle:
        """Inverse of :meth:`to_dict`; raises ValueError naming the malformed field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"puzzle must be a mapping, got {type(data).__name__}")
        expected = {"num_people", "names", "statements", "solution"}
        if set(data) != expected:
            raise ValueError(f"puzzle keys {sorted(data)} must be exactly {sorted(expected)}")
        num_people = data["num_people"]
        if isinstance(num_people, bool) or not isinstance(num_people, int) or not 1 <= num_people <= MAX_PEOPLE:
            raise ValueError(f"puzzle num_people={num_people!r} must be an int in [1, {MAX_PEOPLE}]")
        names = tuple(data["names"])
        if len(names) != num_people or not all(isinstance(name, str) and name for name in names):
            raise ValueError(f"puzzle names={list(names)!r} must be {num_people} non-empty strings")
        solution = tuple(data["solution"])
        if len(solution) != num_people or not all(isinstance(value, bool) for value in solution):
            raise ValueError(f"puzzle solution={list(solution)!r} must be {num_people} booleans")
        statements = []
        for entry in data["statements"]:
            if not isinstance(entry, Sequence) or isinstance(entry, str) or len(entry) != 2:
                raise ValueError(f"puzzle statement entry {entry!r} must be [speaker_index, statement]")
            statements.append((_check_person(entry[0], num_people), statement_from_dict(entry[1], num_people)))
        return cls(names=names, statements=tuple(statements), solution=solution)


def statement_to_dict(statement: Statement) -> dict[str, Any]:
    kind = statement[0]
    if kind in LEAF_KINDS:
        return {"op": kind, "who": statement[1]}
    if kind == "not":
        return {"op": "not", "arg": statement_to_dict(statement[1])}
    return {"op": kind, "args": [statement_to_dict(child) for child in statement[1]]}


def statement_from_dict(data: Any, num_people: int) -> Statement:
    """Inverse of :func:`statement_to_dict`, checking ops, arities and person indices."""
    if not isinstance(data, Mapping) or data.get("op") not in STATEMENT_KINDS:
        raise ValueError(f"statement {data!r} must be a mapping with 'op' in {list(STATEMENT_KINDS)}")
    kind = data["op"]
    fields = {"knight": "who", "knave": "who", "not": "arg"}.get(kind, "args")
    if set(data) != {"op", fields}:
        raise ValueError(f"statement {data!r} with op {kind!r} must have exactly the keys 'op' and {fields!r}")
    if kind in LEAF_KINDS:
        return (kind, _check_person(data["who"], num_people))
    if kind == "not":
        return ("not", statement_from_dict(data["arg"], num_people))
    children = data["args"]
    minimum, maximum = (2, 2) if kind in ("iff", "implies") else (1, None)
    if not isinstance(children, Sequence) or len(children) < minimum or (maximum and len(children) > maximum):
        raise ValueError(f"statement {data!r}: op {kind!r} needs {'exactly 2' if maximum else 'at least 1'} args")
    return (kind, tuple(statement_from_dict(child, num_people) for child in children))


def _check_person(value: Any, num_people: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_people:
        raise ValueError(f"person index {value!r} must be an int in [0, {num_people - 1}]")
    return value


# --- solving ------------------------------------------------------------------------------------------------------
def solve(puzzle: Puzzle) -> list[tuple[bool, ...]]:
    """Every consistent assignment, ordered by assignment index ``sum(2**i for knights i)``."""
    mask = _consistent_mask(puzzle.num_people, puzzle.statements)
    return [_assignment(index, puzzle.num_people) for index in range(1 << puzzle.num_people) if mask >> index & 1]


@functools.lru_cache(maxsize=MAX_PEOPLE + 1)
def _knight_masks(num_people: int) -> tuple[int, tuple[int, ...]]:
    num_assignments = 1 << num_people
    knights = tuple(
        sum(1 << index for index in range(num_assignments) if index >> person & 1) for person in range(num_people)
    )
    return (1 << num_assignments) - 1, knights


def _truth_mask(statement: Statement, all_ones: int, knights: tuple[int, ...]) -> int:
    kind = statement[0]
    if kind == "knight":
        return knights[statement[1]]
    if kind == "knave":
        return all_ones ^ knights[statement[1]]
    if kind == "not":
        return all_ones ^ _truth_mask(statement[1], all_ones, knights)
    masks = [_truth_mask(child, all_ones, knights) for child in statement[1]]
    if kind == "and":
        return functools.reduce(operator.and_, masks, all_ones)
    if kind == "or":
        return functools.reduce(operator.or_, masks, 0)
    if kind == "iff":
        return all_ones ^ (masks[0] ^ masks[1])
    return (all_ones ^ masks[0]) | masks[1]  # implies


def _consistent_mask(num_people: int, statements: Iterable[tuple[int, Statement]]) -> int:
    all_ones, knights = _knight_masks(num_people)
    consistent = all_ones
    for speaker, statement in statements:
        consistent &= all_ones ^ (knights[speaker] ^ _truth_mask(statement, all_ones, knights))
    return consistent


def _assignment(index: int, num_people: int) -> tuple[bool, ...]:
    return tuple(bool(index >> person & 1) for person in range(num_people))


# --- generation ---------------------------------------------------------------------------------------------------
def random_statement(rng: random.Random, speaker: int, num_people: int, depth: int, max_width: int) -> Statement:
    """A statement by ``speaker``, at most ``depth`` levels deep, drawn as the K&K dataset's generator does."""
    kind = "leaf" if depth <= 1 else rng.choice(_NODE_KINDS)
    if kind == "leaf":
        while True:
            leaf = (rng.choice(LEAF_KINDS), rng.randrange(num_people))
            if leaf != ("knave", speaker):
                return leaf
    if kind == "not":
        return ("not", random_statement(rng, speaker, num_people, depth - 1, max_width))
    arity = rng.randint(2, max_width) if kind in ("and", "or") else 2
    children: list[Statement] = []
    for _ in range(arity):
        child = random_statement(rng, speaker, num_people, depth - 1, max_width)
        for _retry in range(8):
            if child not in children:
                break
            child = random_statement(rng, speaker, num_people, depth - 1, max_width)
        children.append(child)
    return (kind, tuple(children))


def sample_puzzle(rng: random.Random, num_people: int, max_depth: int = 2, max_width: int = 2) -> Puzzle:
    """One uniquely solvable puzzle: statements are redrawn until exactly one assignment is consistent."""
    all_ones, knights = _knight_masks(num_people)
    for _ in range(PUZZLE_PATIENCE):
        statements = []
        for speaker in range(num_people):
            statement = random_statement(rng, speaker, num_people, max_depth, max_width)
            # A tautology (C|~C) or contradiction (C&~C) gives its speaker away without reasoning: redraw it.
            while _truth_mask(statement, all_ones, knights) in (0, all_ones):
                statement = random_statement(rng, speaker, num_people, max_depth, max_width)
            statements.append((speaker, statement))
        mask = _consistent_mask(num_people, statements)
        if mask and not mask & (mask - 1):  # exactly one bit set
            names = tuple(rng.sample(NAMES, num_people))
            return Puzzle(names, tuple(statements), _assignment(mask.bit_length() - 1, num_people))
    raise ValueError(f"no uniquely solvable puzzle in {PUZZLE_PATIENCE} draws with num_people={num_people}, "
                     f"max_depth={max_depth}, max_width={max_width}; raise num_people or max_depth")


def generate_puzzles(count: int, num_people: int, seed: int, *, max_depth: int = 2, max_width: int = 2,
                     exclude: Iterable[str] = ()) -> list[Puzzle]:
    """``count`` uniquely solvable puzzles with distinct keys, none in ``exclude``, reproducible from ``seed``."""
    check_int_in_range("num_people", num_people, MIN_PEOPLE, MAX_PEOPLE)
    check_int_in_range("max_depth", max_depth, MIN_DEPTH, MAX_DEPTH_LIMIT)
    check_int_in_range("max_width", max_width, 2, MAX_WIDTH_LIMIT)
    rng = random.Random(f"{TASK_NAME}/puzzles/{num_people}/{max_depth}/{max_width}/{seed}")
    seen = set(exclude)
    puzzles: list[Puzzle] = []
    stale = 0
    while len(puzzles) < count:
        puzzle = sample_puzzle(rng, num_people, max_depth, max_width)
        if puzzle.key in seen:
            stale += 1
            if stale >= PUZZLE_PATIENCE:
                raise ValueError(
                    f"only {len(puzzles)} of count={count} distinct puzzles found with num_people={num_people}, "
                    f"max_depth={max_depth}, max_width={max_width} ({PUZZLE_PATIENCE} draws in a row repeated one): "
                    f"the puzzle space is too small; ask for fewer or raise num_people/max_depth"
                )
            continue
        stale = 0
        seen.add(puzzle.key)
        puzzles.append(puzzle)
    return puzzles


# Puzzles are counted up to this many people (a statement's truth table is one of 2^(2^3) masks); 4 people at depth
# 2 and width 2 already give 269,329,613 distinct puzzles, more than any test pool.
MAX_COUNTED_PEOPLE = 3


def _subset_sums(values: list[int], up: bool, inverse: bool = False) -> list[int]:
    """Each mask's sum over its supersets (``up``) or subsets; ``inverse``: the Moebius inversion of that."""
    values = list(values)
    for bit in (1 << index for index in range(len(values).bit_length() - 1)):
        for low in (mask for mask in range(len(values)) if not mask & bit):
            target, source = (low, low | bit) if up else (low | bit, low)
            values[target] += -values[source] if inverse else values[source]
    return values


def _hadamard(values: list[int]) -> list[int]:
    """The Walsh-Hadamard transform: a product of two transforms is the transform of the XOR convolution."""
    values, step = list(values), 1
    while step < len(values):
        for low in (mask for mask in range(len(values)) if not mask & step):
            values[low], values[low | step] = values[low] + values[low | step], values[low] - values[low | step]
        step *= 2
    return values


@functools.lru_cache(maxsize=None)
def puzzle_space_size(num_people: int, max_depth: int, max_width: int) -> int | None:
    """How many distinct puzzles :func:`sample_puzzle` can draw (None above :data:`MAX_COUNTED_PEOPLE` people):
    each speaker's statements (children distinct, as :func:`random_statement` draws them) counted by truth table,
    then the tuples of them with exactly one consistent assignment. Subset sums turn and/or/implies of truth tables
    into products, the Hadamard transform iff."""
    if num_people > MAX_COUNTED_PEOPLE:
        return None
    all_ones, knights = _knight_masks(num_people)
    size = all_ones + 1
    negated = [all_ones ^ mask for mask in range(size)]
    consistent = _subset_sums([int(mask == all_ones) for mask in range(size)], up=True)
    for speaker in range(num_people):
        leaves = [0] * size
        for kind, who in ((kind, who) for kind in LEAF_KINDS for who in range(num_people)):
            if (kind, who) != ("knave", speaker):
                leaves[knights[who] if kind == "knight" else all_ones ^ knights[who]] += 1
        level = leaves
        for _ in range(max_depth - 1):
            ups, downs = _subset_sums(level, up=True), _subset_sums(level, up=False)
            spectrum = _hadamard(level)
            xors = _hadamard([value * value for value in spectrum])  # size * pairs by x xor y
            parts = [leaves, [level[mask] for mask in negated],  # a leaf, not
                     [xors[mask] // size for mask in negated],  # iff: not (x xor y)
                     _subset_sums([a * b for a, b in zip(_subset_sums([level[m] for m in negated], up=False), downs)],
                                  up=False, inverse=True)]  # implies: not x or y
            for arity in range(2, max_width + 1):  # and, or of `arity` distinct statements, in order
                parts.append(_subset_sums([math.perm(count, arity) for count in ups], up=True, inverse=True))
                parts.append(_subset_sums([math.perm(count, arity) for count in downs], up=False, inverse=True))
            level = [sum(column) for column in zip(*parts)]
            level[all_ones] -= 2 * spectrum[0]  # iff, implies of a statement with itself: never drawn (spectrum[0]: N)
        level[0] = level[all_ones] = 0  # tautologies and contradictions are redrawn
        # the assignments consistent with the speaker's statement: those where its truth equals the speaker's
        sums = _subset_sums([level[all_ones ^ knights[speaker] ^ mask] for mask in range(size)], up=True)
        consistent = [a * b for a, b in zip(consistent, sums)]
    exact = _subset_sums(consistent, up=True, inverse=True)
    return sum(exact[1 << index] for index in range(1 << num_people))


# --- rendering helpers --------------------------------------------------------------------------------------------
def _render(statement: Statement, leaf: Callable[[str, int], str], combine: Callable[[str, list[str]], str]) -> str:
    kind = statement[0]
    if kind in LEAF_KINDS:
        return leaf(kind, statement[1])
    children = [statement[1]] if kind == "not" else list(statement[1])
    texts = [_render(child, leaf, combine) for child in children]
    return combine(kind, [text if child[0] in LEAF_KINDS else f"({text})" for child, text in zip(children, texts)])


# --- compact rendering --------------------------------------------------------------------------------------------
_COMPACT_SYMBOLS = {"and": "&", "or": "|", "iff": "=", "implies": ">"}
_COMPACT_ANSWER = re.compile(r"[KN]+")


def _compact_leaf(kind: str, who: int) -> str:
    return LETTERS[who] if kind == "knight" else f"~{LETTERS[who]}"


def _compact_combine(kind: str, children: list[str]) -> str:
    return f"!{children[0]}" if kind == "not" else _COMPACT_SYMBOLS[kind].join(children)


def render_compact_statement(statement: Statement) -> str:
    """E.g. ``~B&C`` ("B is a knave and C is a knight")."""
    return _render(statement, _compact_leaf, _compact_combine)


def render_compact_prompt(puzzle: Puzzle) -> str:
    """E.g. ``A:~B&C B:!(A|C) C:A=B?``."""
    lines = (f"{LETTERS[speaker]}:{render_compact_statement(statement)}" for speaker, statement in puzzle.statements)
    return " ".join(lines) + "?"


def render_compact_completion(solution: Sequence[bool]) -> str:
    """E.g. ``KNK;`` for (knight, knave, knight)."""
    return "".join("K" if knight else "N" for knight in solution) + COMPACT_TERMINATOR


def parse_compact_answer(completion: str, num_people: int) -> tuple[bool, ...] | None:
    """The ``K``/``N`` letters before the first ``;``, or None unless exactly ``num_people`` of them."""
    text = completion.split(COMPACT_TERMINATOR, 1)[0].strip()
    if len(text) != num_people or not _COMPACT_ANSWER.fullmatch(text):
        return None
    return tuple(letter == "K" for letter in text)


# --- chat rendering -----------------------------------------------------------------------------------------------
CHAT_SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> and "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>. Now the user asks you to solve a logical reasoning problem. After thinking, when you finally reach "
    "a conclusion, clearly state the identity of each character within <answer> </answer> tags. List the identity "
    "of each person one by one, for example, <answer> (1) Zoey is a knight\n(2) Oliver is a knight\n(3)... </answer>."
)
_CHAT_INTRO = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves "
    "always lie. You meet {count} inhabitants: {names}. "
)
_CHAT_QUESTION = "So who is a knight and who is a knave?"
_CHAT_CLOSING = "Every other assignment makes some statement contradict its speaker."
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _chat_combine(kind: str, children: list[str]) -> str:
    if kind == "not":
        return f"it is not the case that {children[0]}"
    if kind == "iff":
        return f"{children[0]} if and only if {children[1]}"
    if kind == "implies":
        return f"if {children[0]} then {children[1]}"
    return f" {kind} ".join(children)  # and, or


def render_chat_statement(statement: Statement, names: Sequence[str]) -> str:
    """E.g. ``Oliver is a knight or it is not the case that (Ethan is a knave and Oliver is a knight)``."""
    return _render(statement, lambda kind, who: f"{names[who]} is a {kind}", _chat_combine)


def _chat_quiz(names: Sequence[str], speakers: Sequence[str], statement_texts: Sequence[str]) -> str:
    listed = " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + ", and " + names[-1]
    said = " ".join(f'{speaker} said, "{text[:1].upper()}{text[1:]}."'
                    for speaker, text in zip(speakers, statement_texts, strict=True))
    return _CHAT_INTRO.format(count=len(names), names=listed) + said + " " + _CHAT_QUESTION


def render_chat_quiz(puzzle: Puzzle) -> str:
    """The puzzle in the K&K dataset's words (the chat rendering's user message)."""
    texts = [render_chat_statement(statement, puzzle.names) for _, statement in puzzle.statements]
    return _chat_quiz(puzzle.names, [puzzle.names[speaker] for speaker, _ in puzzle.statements], texts)


def render_chat_messages(puzzle: Puzzle) -> list[dict[str, str]]:
    """System and user messages for a chat template (verl's dataset ``prompt`` column)."""
    return [{"role": "system", "content": CHAT_SYSTEM_PROMPT}, {"role": "user", "content": render_chat_quiz(puzzle)}]


def render_chat_prompt(puzzle: Puzzle) -> str:
    """The messages as plain text (Logic-RL's base-model template, without a pre-filled ``<think>``)."""
    return f"{CHAT_SYSTEM_PROMPT}\n\nUser: {render_chat_quiz(puzzle)}\nAssistant: "


def _chat_person_parts(index: int, name: str, knight: bool) -> tuple[str, str]:
    role, truth = ("knight", "true") if knight else ("knave", "false")
    return f"{name} is a {role}, so {name}'s statement is {truth}. ", f"({index + 1}) {name} is a {role}\n"


def render_chat_completion(puzzle: Puzzle, solution: Sequence[bool] | None = None) -> str:
    """SFT target: a short check of every statement in ``<think>``, then the answer lines in ``<answer>``."""
    solution = puzzle.solution if solution is None else solution
    parts = [_chat_person_parts(index, name, knight)
             for index, (name, knight) in enumerate(zip(puzzle.names, solution, strict=True))]
    reasons, lines = ("".join(column) for column in zip(*parts))
    return f"<think>\n{reasons}{_CHAT_CLOSING}\n</think>\n<answer>\n{lines}</answer>"


def extract_answer_block(response: str) -> str | None:
    """The stripped text of the single ``<answer>...</answer>`` block, or None."""
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return None
    start = response.index("<answer>") + len("<answer>")
    return response[start:response.index("</answer>")].strip() or None  # "" (None) when the tags are reversed


def parse_chat_answer(response: str, names: Sequence[str]) -> tuple[bool, ...] | None:
    """The assignment stated in the answer block, or None."""
    block = extract_answer_block(response)
    if block is None:
        return None
    lowered = block.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    matches = [re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", block, re.IGNORECASE)
               for name in names]
    if any(match is None for match in matches):
        return None
    return tuple(match.group(1).lower() == "knight" for match in matches)


def has_valid_format(response: str) -> bool:
    """Logic-RL's structure check."""
    if any(response.count(tag) != 1 for tag in _TAGS):
        return False
    positions = [response.index(tag) for tag in _TAGS]
    return positions == sorted(positions)


def logic_rl_score(response: str, puzzle: Puzzle) -> float:
    """format (+1 / -1) + answer (+2 correct, -1.5 wrong, -2 unparsable or format failed)."""
    if not has_valid_format(response):
        return -1.0 - 2.0
    parsed = parse_chat_answer(response, puzzle.names)
    if parsed is None:
        return 1.0 - 2.0
    return 1.0 + (2.0 if parsed == puzzle.solution else -1.5)


def chat_completion_bound(num_people: int) -> int:
    """Upper bound on :func:`render_chat_completion`'s length for ``num_people`` people."""
    longest_name = "x" * max(map(len, NAMES))
    fixed = len(f"<think>\n{_CHAT_CLOSING}\n</think>\n<answer>\n</answer>")
    per_person = (max(sum(map(len, _chat_person_parts(index, longest_name, knight))) for knight in (True, False))
                  for index in range(num_people))
    return fixed + sum(per_person)


# --- the task -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class KnightsKnavesConfig:
    """``task=knights_knaves`` (docs/knights_knaves.md); ``num_people``: an int or a list mixed uniformly."""

    num_people: int | Sequence[int] = 3
    rendering: str = "compact"
    reward: str = "binary"
    max_depth: int = 2
    max_width: int = 2
    test_size: int = 256
    test_seed: int = 12345

    def __post_init__(self) -> None:
        counts = [self.num_people] if isinstance(self.num_people, int) else self.num_people
        if isinstance(counts, str) or not isinstance(counts, Sequence) or len(counts) == 0:
            raise ValueError(
                f"{TASK_NAME} task param num_people={self.num_people!r} is invalid; allowed: an int or a non-empty "
                f"list of ints in [{MIN_PEOPLE}, {MAX_PEOPLE}]"
            )
        counts = tuple(check_int_in_range("num_people", count, MIN_PEOPLE, MAX_PEOPLE) for count in counts)
        if len(set(counts)) != len(counts):
            raise ValueError(f"{TASK_NAME} task param num_people={list(counts)!r} repeats a count; list each once")
        if not isinstance(self.num_people, int):
            object.__setattr__(self, "num_people", counts)
        check_choice("rendering", self.rendering, RENDERINGS)
        check_choice("reward", self.reward, REWARDS)
        if self.reward == "logic_rl" and self.rendering != "chat":
            raise ValueError(
                f"{TASK_NAME} task param reward='logic_rl' scores <think>/<answer> tags and needs rendering='chat', "
                f"got rendering={self.rendering!r}; use reward='binary' with the compact rendering"
            )
        check_int_in_range("max_depth", self.max_depth, MIN_DEPTH, MAX_DEPTH_LIMIT)
        check_int_in_range("max_width", self.max_width, 2, MAX_WIDTH_LIMIT)
        check_non_negative_int("test_size", self.test_size)
        check_non_negative_int("test_seed", self.test_seed)
        # Each count's share of the pool (see KnightsKnavesTask._puzzles) at most half its puzzles, so training has
        # puzzles left to draw: a share of h allows test_size h * len(counts) + position.
        spaces = {count: space for count in counts
                  if (space := puzzle_space_size(count, self.max_depth, self.max_width)) is not None}
        allowed = min((spaces[count] // 2 * len(counts) + position for position, count in enumerate(counts)
                       if count in spaces), default=self.test_size)
        if self.test_size > allowed:
            raise ValueError(f"test_size = {self.test_size} is not allowed: each people count's share of the test pool "
                             f"may be at most half of its distinct puzzles, so training has puzzles left, and at "
                             f"max_depth={self.max_depth}, max_width={self.max_width} there are "
                             f"{', '.join(f'{space} for num_people={count}' for count, space in spaces.items())}; "
                             f"allowed: test_size <= {allowed}")


@TASKS.register(TASK_NAME)
class KnightsKnavesTask(Task):
    """Knights-and-Knaves puzzles; ``problem.answer`` is :meth:`Puzzle.to_dict`, difficulty = number of people."""

    config_class = KnightsKnavesConfig
    verl_ability = "logic"
    verl_reward_options = (VERL_REWARD_OPTION,)

    def __init__(self, config: KnightsKnavesConfig) -> None:
        super().__init__(config)
        self._counts = (config.num_people,) if isinstance(config.num_people, int) else tuple(config.num_people)

    def make_problem(self, puzzle: Puzzle) -> Problem:
        if self.config.rendering == "compact":
            prompt, completion = render_compact_prompt(puzzle), render_compact_completion(puzzle.solution)
        else:
            prompt, completion = render_chat_prompt(puzzle), render_chat_completion(puzzle)
        return Problem(prompt, completion, puzzle.to_dict(), puzzle.num_people, puzzle.key)

    def sample_problem(self, rng: random.Random) -> Problem:
        """One uniquely solvable puzzle, its number of people drawn uniformly from ``num_people``."""
        num_people = self._counts[0] if len(self._counts) == 1 else rng.choice(self._counts)
        return self.make_problem(sample_puzzle(rng, num_people, self.config.max_depth, self.config.max_width))

    def build_test_pool(self) -> list[Problem]:
        """``test_size`` puzzles split evenly over the people counts, interleaved so every prefix mixes them."""
        per_count = [self._puzzles(self.config.test_size, position, self.config.test_seed)
                     for position in range(len(self._counts))]
        return [self.make_problem(puzzle) for puzzle in _interleave(per_count)]

    def parse(self, problem: Problem, completion: str) -> tuple[bool, ...] | None:
        if self.config.rendering == "compact":
            return parse_compact_answer(completion, problem.difficulty)
        return parse_chat_answer(completion, problem.answer["names"])

    def is_correct(self, problem: Problem, completion: str) -> bool:
        parsed = self.parse(problem, completion)
        return parsed is not None and list(parsed) == problem.answer["solution"]

    def reward(self, problem: Problem, completion: str) -> float:
        """``logic_rl``: :func:`logic_rl_score` (3, -0.5, -1, -3); ``binary``: 1.0 correct, else 0.0."""
        if self.config.reward == "logic_rl":
            return logic_rl_score(completion, Puzzle.from_dict(problem.answer))
        return 1.0 if self.is_correct(problem, completion) else 0.0

    @property
    def max_completion_chars(self) -> int:
        """One letter per person plus ``;`` (compact), or the chat completion's bound."""
        if self.config.rendering == "compact":
            return max(self._counts) + len(COMPACT_TERMINATOR)
        return max(chat_completion_bound(count) for count in self._counts)

    @property
    def alphabet(self) -> str:
        """Printable ASCII (chat), or the compact rendering's letters and symbols."""
        if self.config.rendering == "chat":
            return "".join(sorted(set(string.printable) - set("\t\r\x0b\x0c")))
        people = LETTERS[: max(self._counts)]
        return "".join(sorted(set(people) | set("~!&|=>():? KN") | set(COMPACT_TERMINATOR)))

    # --- verl hooks ---------------------------------------------------------------------------------------------
    @classmethod
    def verl_score(cls, response: str, answer: Any, knights_knaves_reward: str = "logic_rl") -> dict[str, float]:
        """``logic_rl`` (3, -0.5, -1, -3) or ``binary`` score of the chat rendering; ``acc`` is 1.0 when right."""
        puzzle = Puzzle.from_dict(answer)
        correct = 1.0 if parse_chat_answer(response, puzzle.names) == puzzle.solution else 0.0
        if knights_knaves_reward == "logic_rl":
            return {"score": logic_rl_score(response, puzzle), "acc": correct}
        if knights_knaves_reward == "binary":
            return {"score": correct, "acc": correct}
        raise ValueError(
            f"{VERL_REWARD_OPTION}={knights_knaves_reward!r} is invalid; allowed: {', '.join(map(repr, REWARDS))}"
        )

    @classmethod
    def verl_messages(cls, problem: Problem) -> list[dict[str, str]]:
        """The chat rendering's system and user messages, whatever this task's rendering."""
        return render_chat_messages(Puzzle.from_dict(problem.answer))

    def verl_problems(self, train_size: int, test_size: int, seed: int) -> dict[str, list[Problem]]:
        """Distinct puzzles split evenly over the people counts, as in arXiv:2505.12929 (and Logic-RL)."""
        test_by_count = [self._puzzles(test_size, position, self.config.test_seed)
                         for position in range(len(self._counts))]
        train = [self.make_problem(puzzle) for position, test in enumerate(test_by_count)
                 for puzzle in self._puzzles(train_size, position, seed, [item.key for item in test])]
        random.Random(f"{TASK_NAME}/verl-train-order/{seed}").shuffle(train)
        return {"train": train, "test": [self.make_problem(puzzle) for puzzle in _interleave(test_by_count)]}

    def _puzzles(self, total: int, position: int, seed: int, exclude: Iterable[str] = ()) -> list[Puzzle]:
        """The ``position``-th count's near-equal share of ``total`` puzzles (the first ones get one more)."""
        parts = len(self._counts)
        return generate_puzzles(total // parts + (position < total % parts), self._counts[position], seed,
                                max_depth=self.config.max_depth, max_width=self.config.max_width, exclude=exclude)


def _interleave(lists: list[list[Puzzle]]) -> list[Puzzle]:
    return [items[row] for row in range(max(map(len, lists))) for items in lists if row < len(items)]
