"""Knights-and-Knaves puzzles: generator, solver, two renderings with their parsers, rewards and the task.

Each of N people is a knight (always tells the truth) or a knave (always lies) and makes exactly one statement, so a
speaker is a knight exactly when their statement is true. Statements come from the grammar::

    S := knight(j) | knave(j) | not S | and(S, ..., S) | or(S, ..., S) | iff(S, S) | implies(S, S)

with leaves at depth 1, at most ``max_depth`` levels and at most ``max_width`` arguments to ``and``/``or``, sampled
as in the K&K dataset (arXiv:2410.23123) that Logic-RL trains on. As there, a statement may name its own speaker
(only the paradox "I am a knave" is excluded). Statements true or false under every assignment are redrawn, since
they give their speaker away; restricted to the others, every remaining two-person statement would be "the other is
a knight" or its negation, and no such pair of statements has a unique solution. A puzzle is kept only when exactly
one of the 2^N knight/knave assignments is consistent. Internally a statement is a nested
tuple (``("knight", 1)``, ``("not", S)``, ``("and", (S, S))``); :meth:`Puzzle.to_dict` gives the JSON form
``{"op": "knight", "who": 1}``, ``{"op": "not", "arg": S}``, ``{"op": "and", "args": [S, S]}``.

Solving: the truth value of every statement under all 2^N assignments is one Python int used as a bitmask (bit m is
assignment m, in which person i is a knight iff bit i of m is set), so ``and``/``or``/``not`` are single integer
operations and the consistent assignments are ``AND_i not(knight_i XOR statement_i)``.

Renderings:

1. ``compact`` (character-level models): people are letters ``A``, ``B``, ...; ``B`` is "B is a knight", ``~B`` "B is
   a knave", ``!X`` not, ``&`` and, ``|`` or, ``=`` iff, ``>`` implies, compound arguments in parentheses. Prompt
   ``A:~B&C B:!(A|C) C:A=B?``, completion ``KNK;`` (``K`` knight, ``N`` knave, terminator ``;``).
2. ``chat`` (chat models), as in Logic-RL (arXiv:2502.14768) and arXiv:2505.12929: a system prompt asking for
   reasoning in ``<think>...</think>`` and the answer in ``<answer>...</answer>`` as lines
   ``(1) Zoey is a knight``; the puzzle text follows the K&K dataset's phrasing. The prompt is not pre-filled with
   ``<think>``: the response must open it.

Rewards: ``binary`` (1.0 correct, else 0.0) and ``logic_rl`` (chat only): format score +1 when the response holds
exactly one ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` in that order, else -1; answer score +2 correct,
-1.5 parsed but wrong, -2 unparsable or format failed; total = format + answer, so the values are 3, -0.5, -1, -3.

Train/test: the key of a puzzle is its compact prompt (names play no part), shared by both renderings. Two-person
puzzles form a space of about 220 distinct keys at the default ``max_depth=2``: a model can memorise all of them,
so a two-person "test set" is no held-out test of reasoning (and ``test_size`` must stay well below 220); evaluate
on 3 or more people (1975 distinct keys in 2000 three-person draws).
"""

from __future__ import annotations

import dataclasses
import random
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from dataflex_rl.tasks.base import TASKS, Problem, Task, check_choice, check_int

TASK_NAME = "knights_knaves"
COMPACT_TERMINATOR = ";"
CHAT_TERMINATOR = "</answer>"
RENDERINGS = ("compact", "chat")
REWARDS = ("binary", "logic_rl")
MIN_PEOPLE = 2
MAX_PEOPLE = 12  # 2^12 assignments per bitmask; letters A..L in the compact rendering
# Depth 1 (leaves only) never has a unique solution: every constraint is then "X == Y" or "X != Y", which swapping
# every knight with a knave preserves, so solutions come in pairs.
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
    """``names[i]`` is person i; ``statements`` holds ``(speaker, statement)`` pairs; ``solution[i]`` is True for a
    knight. Built by :func:`generate_puzzles` (one statement per person, unique solution) or :meth:`from_dict`."""

    names: tuple[str, ...]
    statements: tuple[tuple[int, Statement], ...]
    solution: tuple[bool, ...]

    @property
    def num_people(self) -> int:
        """N, the number of inhabitants (and of statements)."""
        return len(self.names)

    @property
    def key(self) -> str:
        """Canonical identity: the compact prompt (independent of names)."""
        return render_compact_prompt(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the ground truth of verl rows and ``Problem.answer``); :meth:`from_dict` inverts it."""
        return {
            "num_people": self.num_people,
            "names": list(self.names),
            "statements": [[speaker, statement_to_dict(statement)] for speaker, statement in self.statements],
            "solution": list(self.solution),
        }

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
            speaker = _check_person(entry[0], num_people)
            statements.append((speaker, statement_from_dict(entry[1], num_people)))
        return cls(names=names, statements=tuple(statements), solution=solution)


def statement_to_dict(statement: Statement) -> dict[str, Any]:
    """The JSON form of a statement: ``{"op": "knight", "who": 1}``, ``{"op": "not", "arg": S}``,
    ``{"op": "and", "args": [S, S]}``."""
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
def evaluate(statement: Statement, assignment: Sequence[bool]) -> bool:
    """Truth of ``statement`` when ``assignment[i]`` says whether person i is a knight."""
    kind = statement[0]
    if kind == "knight":
        return bool(assignment[statement[1]])
    if kind == "knave":
        return not assignment[statement[1]]
    if kind == "not":
        return not evaluate(statement[1], assignment)
    values = [evaluate(child, assignment) for child in statement[1]]
    if kind == "and":
        return all(values)
    if kind == "or":
        return any(values)
    if kind == "iff":
        return values[0] == values[1]
    return (not values[0]) or values[1]  # implies


def is_consistent(puzzle: Puzzle, assignment: Sequence[bool]) -> bool:
    """Every speaker is a knight exactly when their statement is true under ``assignment``."""
    return all(bool(assignment[speaker]) == evaluate(statement, assignment) for speaker, statement in puzzle.statements)


def solve(puzzle: Puzzle) -> list[tuple[bool, ...]]:
    """Every consistent assignment, ordered by assignment index ``sum(2**i for knights i)``."""
    mask = _consistent_mask(puzzle.num_people, puzzle.statements)
    return [_assignment(index, puzzle.num_people) for index in range(1 << puzzle.num_people) if mask >> index & 1]


@lru_cache(maxsize=MAX_PEOPLE + 1)
def _knight_masks(num_people: int) -> tuple[int, tuple[int, ...]]:
    """``(all_ones, knight_masks)``: bit m of ``knight_masks[i]`` is set iff person i is a knight in assignment m."""
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
        result = all_ones
        for mask in masks:
            result &= mask
        return result
    if kind == "or":
        result = 0
        for mask in masks:
            result |= mask
        return result
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
    """A statement by ``speaker``, at most ``depth`` levels deep, drawn as the K&K dataset's generator does.

    Below the depth limit a node is a leaf, ``not``, ``and``, ``or``, ``implies`` or ``iff`` with probability 1/6
    each; at depth 1 it is a leaf. A leaf names anyone, the speaker included, except the paradox "I am a knave";
    ``and``/``or`` take 2..``max_width`` arguments; siblings are redrawn a few times to avoid repeats like ``B&B``.
    """
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
    """One uniquely solvable puzzle: statements are redrawn until exactly one assignment is consistent.

    Statements true (or false) under every assignment are redrawn first: they would give their speaker away.
    """
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
    raise ValueError(
        f"no uniquely solvable puzzle in {PUZZLE_PATIENCE} draws with num_people={num_people}, "
        f"max_depth={max_depth}, max_width={max_width}; raise num_people or max_depth"
    )


def generate_puzzles(
    count: int,
    num_people: int,
    seed: int,
    *,
    max_depth: int = 2,
    max_width: int = 2,
    exclude: Iterable[str] = (),
) -> list[Puzzle]:
    """``count`` uniquely solvable puzzles with distinct keys, none in ``exclude``, reproducible from ``seed``.

    Raises ValueError when the space runs out (no new puzzle in ``PUZZLE_PATIENCE`` consecutive draws), which
    happens for two people, whose whole space is small.
    """
    check_int(TASK_NAME, "num_people", num_people, MIN_PEOPLE, MAX_PEOPLE)
    check_int(TASK_NAME, "max_depth", max_depth, MIN_DEPTH, MAX_DEPTH_LIMIT)
    check_int(TASK_NAME, "max_width", max_width, 2, MAX_WIDTH_LIMIT)
    rng = random.Random(f"{TASK_NAME}/puzzles/{num_people}/{max_depth}/{max_width}/{seed}")
    seen = set(exclude)
    puzzles: list[Puzzle] = []
    stale = 0
    while len(puzzles) < count:
        puzzle = sample_puzzle(rng, num_people, max_depth, max_width)
        key = puzzle.key
        if key in seen:
            stale += 1
            if stale >= PUZZLE_PATIENCE:
                raise ValueError(
                    f"only {len(puzzles)} of count={count} distinct puzzles found with num_people={num_people}, "
                    f"max_depth={max_depth}, max_width={max_width} ({PUZZLE_PATIENCE} draws in a row repeated one): "
                    f"the puzzle space is too small; ask for fewer or raise num_people/max_depth"
                )
            continue
        stale = 0
        seen.add(key)
        puzzles.append(puzzle)
    return puzzles


# --- rendering helpers --------------------------------------------------------------------------------------------
def _render(statement: Statement, leaf: Callable[[str, int], str], combine: Callable[[str, list[str]], str]) -> str:
    """Render bottom-up: leaves by ``leaf(kind, who)``, compound nodes by ``combine(kind, children)`` with compound
    children already wrapped in parentheses."""
    kind = statement[0]
    if kind in LEAF_KINDS:
        return leaf(kind, statement[1])
    children = [statement[1]] if kind == "not" else list(statement[1])
    parts = []
    for child in children:
        text = _render(child, leaf, combine)
        parts.append(text if child[0] in LEAF_KINDS else f"({text})")
    return combine(kind, parts)


def _length_bound(max_depth: int, max_width: int, leaf_max: int, combine: Callable[[str, list[str]], str]) -> int:
    """Upper bound on a rendered statement's length: rendering length grows with each child's length and with the
    number of children, so combining the longest possible children at the largest arity bounds every node."""
    longest = leaf_max
    for _ in range(2, max_depth + 1):
        child = "x" * max(leaf_max, longest + 2)  # + 2: parentheses around a compound child
        arities = {"not": 1, "and": max_width, "or": max_width, "iff": 2, "implies": 2}
        longest = max(longest, *(len(combine(kind, [child] * arity)) for kind, arity in arities.items()))
    return longest


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
    """The assignment before the first ``;`` (all the text when there is none), or None unless it is exactly
    ``num_people`` letters from ``K``/``N`` after stripping whitespace."""
    text = completion.split(COMPACT_TERMINATOR, 1)[0].strip()
    if len(text) != num_people or not _COMPACT_ANSWER.fullmatch(text):
        return None
    return tuple(letter == "K" for letter in text)


def compact_prompt_bound(num_people: int, max_depth: int, max_width: int) -> int:
    """Upper bound on the compact prompt's length for ``num_people`` people and the statement limits."""
    statement = _length_bound(max_depth, max_width, len("~A"), _compact_combine)
    return num_people * (len("A:") + statement) + (num_people - 1) + len("?")


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
    said = " ".join(
        f'{speaker} said, "{text[:1].upper()}{text[1:]}."'
        for speaker, text in zip(speakers, statement_texts, strict=True)
    )
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
    parts = [
        _chat_person_parts(index, name, knight)
        for index, (name, knight) in enumerate(zip(puzzle.names, solution, strict=True))
    ]
    reasons = "".join(reason for reason, _ in parts)
    lines = "".join(line for _, line in parts)
    return f"<think>\n{reasons}{_CHAT_CLOSING}\n</think>\n<answer>\n{lines}</answer>"


def extract_answer_block(response: str) -> str | None:
    """The stripped text inside the single ``<answer>...</answer>`` block, or None when the tags are missing,
    repeated, out of order or enclose only whitespace."""
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return None
    start = response.index("<answer>") + len("<answer>")
    end = response.index("</answer>")
    if end < start:
        return None
    return response[start:end].strip() or None


def parse_chat_answer(response: str, names: Sequence[str]) -> tuple[bool, ...] | None:
    """The assignment stated in the answer block, or None.

    As Logic-RL's parser: the block must mention ``knight``/``knave`` exactly ``len(names)`` times in total (so
    extra or repeated people fail), and every name must appear as ``<name> is a knight|knave`` (case-insensitive).
    """
    block = extract_answer_block(response)
    if block is None:
        return None
    lowered = block.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    assignment = []
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", block, re.IGNORECASE)
        if match is None:
            return None
        assignment.append(match.group(1).lower() == "knight")
    return tuple(assignment)


def has_valid_format(response: str) -> bool:
    """Logic-RL's structure check: each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` exactly once, in
    that order (text before, between and after is allowed)."""
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


def chat_prompt_bound(num_people: int, max_depth: int, max_width: int) -> int:
    """Upper bound on the chat prompt's length: the longest name everywhere and the longest statement each."""
    longest_name = "x" * max(map(len, NAMES))
    leaf = len(f"{longest_name} is a knight")
    statement = "x" * _length_bound(max_depth, max_width, leaf, _chat_combine)
    names = [longest_name] * num_people
    quiz = _chat_quiz(names, names, [statement] * num_people)
    return len(f"{CHAT_SYSTEM_PROMPT}\n\nUser: {quiz}\nAssistant: ")


def chat_completion_bound(num_people: int) -> int:
    """Upper bound on :func:`render_chat_completion`'s length for ``num_people`` people."""
    longest_name = "x" * max(map(len, NAMES))
    fixed = len(f"<think>\n{_CHAT_CLOSING}\n</think>\n<answer>\n</answer>")
    per_person = (
        max(sum(map(len, _chat_person_parts(index, longest_name, knight))) for knight in (True, False))
        for index in range(num_people)
    )
    return fixed + sum(per_person)


# --- the task -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class KnightsKnavesConfig:
    """Params of ``conf/task/knights_knaves.yaml``. ``num_people``: an int, or a list of ints mixed uniformly."""

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
        counts = tuple(check_int(TASK_NAME, "num_people", count, MIN_PEOPLE, MAX_PEOPLE) for count in counts)
        if len(set(counts)) != len(counts):
            raise ValueError(f"{TASK_NAME} task param num_people={list(counts)!r} repeats a count; list each once")
        if not isinstance(self.num_people, int):
            object.__setattr__(self, "num_people", counts)
        check_choice(TASK_NAME, "rendering", self.rendering, RENDERINGS)
        check_choice(TASK_NAME, "reward", self.reward, REWARDS)
        if self.reward == "logic_rl" and self.rendering != "chat":
            raise ValueError(
                f"{TASK_NAME} task param reward='logic_rl' scores <think>/<answer> tags and needs rendering='chat', "
                f"got rendering={self.rendering!r}; use reward='binary' with the compact rendering"
            )
        check_int(TASK_NAME, "max_depth", self.max_depth, MIN_DEPTH, MAX_DEPTH_LIMIT)
        check_int(TASK_NAME, "max_width", self.max_width, 2, MAX_WIDTH_LIMIT)
        check_int(TASK_NAME, "test_size", self.test_size, 0)
        check_int(TASK_NAME, "test_seed", self.test_seed, 0)

    @property
    def people_counts(self) -> tuple[int, ...]:
        """``num_people`` as a tuple of counts (one count for an int)."""
        return (self.num_people,) if isinstance(self.num_people, int) else tuple(self.num_people)


@TASKS.register(TASK_NAME)
class KnightsKnavesTask(Task):
    """Knights-and-Knaves puzzles; ``problem.answer`` is :meth:`Puzzle.to_dict`, difficulty = number of people."""

    name = TASK_NAME
    config_class = KnightsKnavesConfig
    terminator = COMPACT_TERMINATOR  # per instance: CHAT_TERMINATOR with the chat rendering
    verl_ability = "logic"
    verl_reward_options = (VERL_REWARD_OPTION,)

    def __init__(self, config: KnightsKnavesConfig) -> None:
        super().__init__(config)
        self.terminator = COMPACT_TERMINATOR if config.rendering == "compact" else CHAT_TERMINATOR
        self._counts = config.people_counts

    def make_problem(self, puzzle: Puzzle) -> Problem:
        """The puzzle as a problem in this task's rendering; ``answer`` is :meth:`Puzzle.to_dict`."""
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
        size, counts = self.config.test_size, self._counts
        per_count = [
            generate_puzzles(
                _share(size, position, len(counts)),
                num_people,
                self.config.test_seed,
                max_depth=self.config.max_depth,
                max_width=self.config.max_width,
            )
            for position, num_people in enumerate(counts)
        ]
        interleaved = [puzzles[row] for row in range(len(per_count[0])) for puzzles in per_count if row < len(puzzles)]
        return [self.make_problem(puzzle) for puzzle in interleaved]

    def parse(self, problem: Problem, completion: str) -> tuple[bool, ...] | None:
        """The assignment the completion states, by the task's rendering, or None."""
        if self.config.rendering == "compact":
            return parse_compact_answer(completion, problem.difficulty)
        return parse_chat_answer(completion, problem.answer["names"])

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether the completion states the unique solution (parsed by :meth:`parse`)."""
        parsed = self.parse(problem, completion)
        return parsed is not None and list(parsed) == problem.answer["solution"]

    def reward(self, problem: Problem, completion: str) -> float:
        """``logic_rl``: :func:`logic_rl_score` (3, -0.5, -1, -3); ``binary``: 1.0 correct, else 0.0."""
        if self.config.reward == "logic_rl":
            return logic_rl_score(completion, Puzzle.from_dict(problem.answer))
        return 1.0 if self.is_correct(problem, completion) else 0.0

    @property
    def max_prompt_chars(self) -> int:
        """The rendering's prompt bound at the largest people count."""
        bound = compact_prompt_bound if self.config.rendering == "compact" else chat_prompt_bound
        return max(bound(count, self.config.max_depth, self.config.max_width) for count in self._counts)

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
        """The chat rendering's parser on ``response`` with the ``logic_rl`` reward (3, -0.5, -1, -3) or, with
        ``reward_kwargs.knights_knaves_reward=binary``, 1.0/0.0; ``acc`` is 1.0 exactly when the answer is right.

        ``answer`` is the whole :meth:`Puzzle.to_dict` (the parser needs the names, not only the solution).
        """
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
        """Distinct puzzles split evenly over the people counts, as in arXiv:2505.12929 (and Logic-RL).

        Per count, the test puzzles are drawn first from ``config.test_seed`` (the first ones of the local test
        pool with that seed) and train puzzles with their keys are excluded; within a split no puzzle repeats.
        Train problems are shuffled by ``seed``; test problems are interleaved by count, so every prefix (verl's
        ``data.val_max_samples``) mixes the difficulties.
        """
        train: list[Problem] = []
        test_by_count: list[list[Problem]] = []
        for position, num_people in enumerate(self._counts):
            test_puzzles = self._verl_puzzles(_share(test_size, position, len(self._counts)), num_people,
                                              self.config.test_seed)
            train_puzzles = self._verl_puzzles(_share(train_size, position, len(self._counts)), num_people, seed,
                                               exclude=[puzzle.key for puzzle in test_puzzles])
            test_by_count.append([self.make_problem(puzzle) for puzzle in test_puzzles])
            train.extend(self.make_problem(puzzle) for puzzle in train_puzzles)
        random.Random(f"{TASK_NAME}/verl-train-order/{seed}").shuffle(train)
        longest = max(map(len, test_by_count))
        test = [problems[row] for row in range(longest) for problems in test_by_count if row < len(problems)]
        return {"train": train, "test": test}

    def _verl_puzzles(self, count: int, num_people: int, seed: int, exclude: Iterable[str] = ()) -> list[Puzzle]:
        return generate_puzzles(count, num_people, seed, max_depth=self.config.max_depth,
                                max_width=self.config.max_width, exclude=exclude)


def _share(total: int, position: int, parts: int) -> int:
    """The ``position``-th of ``parts`` near-equal shares of ``total`` (the first ``total % parts`` get one more)."""
    return total // parts + (position < total % parts)
