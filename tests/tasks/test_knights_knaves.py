"""Knights-and-Knaves: solver, generator properties, renderings, parsers, rewards, the task."""

from __future__ import annotations

import collections
import functools
import itertools
import json
import math
import operator
import random
import string
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflex_rl.compose import compose_train_config
from dataflex_rl.tasks import build_task
from dataflex_rl.tasks import knights_knaves as kk
from dataflex_rl.tasks.knights_knaves import (
    CHAT_SYSTEM_PROMPT,
    LEAF_KINDS,
    NAMES,
    Puzzle,
    chat_completion_bound,
    generate_puzzles,
    has_valid_format,
    logic_rl_score,
    parse_chat_answer,
    parse_compact_answer,
    render_chat_completion,
    render_chat_quiz,
    render_compact_completion,
    render_compact_prompt,
    render_compact_statement,
    _chat_combine,
    _chat_quiz,
    _compact_combine,
    solve,
)
from dataflex_rl.validation import ConfigError


def evaluate(statement: tuple, assignment: Sequence[bool]) -> bool:
    """The reference evaluator the bitmask solver is checked against."""
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


def _length_bound(max_depth: int, max_width: int, leaf_max: int, combine: Callable[[str, list[str]], str]) -> int:
    longest = leaf_max
    for _ in range(2, max_depth + 1):
        child = "x" * max(leaf_max, longest + 2)  # + 2: parentheses around a compound child
        arities = {"not": 1, "and": max_width, "or": max_width, "iff": 2, "implies": 2}
        longest = max(longest, *(len(combine(kind, [child] * arity)) for kind, arity in arities.items()))
    return longest


def compact_prompt_bound(num_people: int, max_depth: int, max_width: int) -> int:
    """Upper bound on the compact prompt's length for ``num_people`` people and the statement limits."""
    statement = _length_bound(max_depth, max_width, len("~A"), _compact_combine)
    return num_people * (len("A:") + statement) + (num_people - 1) + len("?")


def chat_prompt_bound(num_people: int, max_depth: int, max_width: int) -> int:
    """Upper bound on the chat prompt's length: the longest name everywhere and the longest statement each."""
    longest_name = "x" * max(map(len, NAMES))
    leaf = len(f"{longest_name} is a knight")
    statement = "x" * _length_bound(max_depth, max_width, leaf, _chat_combine)
    names = [longest_name] * num_people
    quiz = _chat_quiz(names, names, [statement] * num_people)
    return len(f"{CHAT_SYSTEM_PROMPT}\n\nUser: {quiz}\nAssistant: ")


KNIGHT_A, KNIGHT_B, KNIGHT_C = ("knight", 0), ("knight", 1), ("knight", 2)
KNAVE_A, KNAVE_B = ("knave", 0), ("knave", 1)


def _puzzle(statements: list, names: tuple[str, ...] = ("Zoey", "Oliver", "Ethan"), solution=None) -> Puzzle:
    solution = solution if solution is not None else (False,) * len(names)
    return Puzzle(names=names, statements=tuple(statements), solution=tuple(solution))


# The worked puzzle used by several tests. A: "B is a knave" forces A != B; B: "A iff C" forces B == (A == C);
# C: "A implies B" forces C == (not A or B).
#   A=K, B=N: B's constraint gives C = N; C's: N == (N or N) holds                -> (K, N, N)
#   A=N, B=K: B's constraint gives C = N; C's: N == (K or K) fails
# so (knight, knave, knave) is the only solution.
WORKED = _puzzle(
    [(0, KNAVE_B), (1, ("iff", (KNIGHT_A, KNIGHT_C))), (2, ("implies", (KNIGHT_A, KNIGHT_B)))],
    solution=(True, False, False),
)


# --- solver -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("statements", "names", "solutions"),
    [
        # "At least one of us is a knave" (A), "A is a knave" (B): a knave A would make A's claim true.
        ([(0, ("or", (KNAVE_A, KNAVE_B))), (1, KNAVE_A)], ("A", "B"), [(True, False)]),
        # "We are both knaves" (A) is false whoever says it, so A is a knave and B a knight.
        ([(0, ("and", (KNAVE_A, KNAVE_B))), (1, KNAVE_A)], ("A", "B"), [(False, True)]),
        # Each vouches for the other: both knights or both knaves (assignment index 0 = NN, 3 = KK).
        ([(0, KNIGHT_B), (1, KNIGHT_A)], ("A", "B"), [(False, False), (True, True)]),
        # "I am a knave" has no consistent speaker.
        ([(0, KNAVE_A)], ("A", "B"), []),
        # Nobody speaks: every assignment, ordered by sum(2**i for knights i).
        ([], ("A", "B"), [(False, False), (True, False), (False, True), (True, True)]),
        (list(WORKED.statements), WORKED.names, [(True, False, False)]),
        # "not (B is a knight)" is "B is a knave" (A), "A is a knight" (B): A != B and B == A, impossible.
        ([(0, ("not", KNIGHT_B)), (1, KNIGHT_A)], ("A", "B"), []),
    ],
)
def test_solve_hand_made(statements: list, names: tuple[str, ...], solutions: list) -> None:
    puzzle = _puzzle(statements, names)
    assert solve(puzzle) == solutions
    assert [assignment for assignment in _brute_force(puzzle)] == solutions


def _brute_force(puzzle: Puzzle) -> list[tuple[bool, ...]]:
    """Reference solver: every assignment in index order, checked with the recursive evaluator."""
    assignments = (tuple(bits[::-1]) for bits in itertools.product((False, True), repeat=puzzle.num_people))
    return [assignment for assignment in assignments if is_consistent(puzzle, assignment)]


@pytest.mark.parametrize(
    ("statement", "assignment", "value"),
    [
        (("and", (KNIGHT_A, KNAVE_B, KNIGHT_C)), (True, False, True), True),
        (("and", (KNIGHT_A, KNAVE_B, KNIGHT_C)), (True, True, True), False),
        (("or", (KNAVE_A, KNAVE_B)), (True, True, False), False),
        (("iff", (KNIGHT_A, KNIGHT_B)), (False, False, True), True),
        (("implies", (KNIGHT_A, KNIGHT_B)), (False, False, False), True),
        (("implies", (KNIGHT_A, KNIGHT_B)), (True, False, False), False),
        (("not", ("or", (KNIGHT_A, KNIGHT_C))), (False, True, False), True),
    ],
)
def test_evaluate_hand_values(statement: tuple, assignment: tuple, value: bool) -> None:
    assert evaluate(statement, assignment) is value


def _statements(num_people: int) -> st.SearchStrategy:
    leaves = st.tuples(st.sampled_from(LEAF_KINDS), st.integers(0, num_people - 1))
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.tuples(st.just("not"), children),
            st.tuples(st.sampled_from(["and", "or"]), st.lists(children, min_size=1, max_size=3).map(tuple)),
            st.tuples(st.sampled_from(["iff", "implies"]), st.tuples(children, children)),
        ),
        max_leaves=6,
    )


@st.composite
def _arbitrary_puzzles(draw: st.DrawFn) -> Puzzle:
    num_people = draw(st.integers(1, 5))
    speakers = draw(st.lists(st.integers(0, num_people - 1), max_size=num_people + 1))
    statements = [(speaker, draw(_statements(num_people))) for speaker in speakers]
    return _puzzle(statements, tuple(f"P{index}" for index in range(num_people)))


@settings(max_examples=150, deadline=None)
@given(puzzle=_arbitrary_puzzles())
def test_bitmask_solver_equals_brute_force(puzzle: Puzzle) -> None:
    """Any puzzle (no, one or many solutions): the bitmask solver agrees with per-assignment evaluation."""
    assert solve(puzzle) == _brute_force(puzzle)


# --- generator ----------------------------------------------------------------------------------------------------
def _depth(statement: tuple) -> int:
    if statement[0] in LEAF_KINDS:
        return 1
    children = [statement[1]] if statement[0] == "not" else statement[1]
    return 1 + max(_depth(child) for child in children)


def _widths(statement: tuple) -> list[int]:
    if statement[0] in LEAF_KINDS:
        return []
    children = [statement[1]] if statement[0] == "not" else list(statement[1])
    own = [len(children)] if statement[0] in ("and", "or") else []
    return own + [width for child in children for width in _widths(child)]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32), num_people=st.integers(2, 6), max_depth=st.integers(2, 3), max_width=st.integers(2, 3)
)
def test_generated_puzzles_have_exactly_the_stored_solution(
    seed: int, num_people: int, max_depth: int, max_width: int
) -> None:
    puzzles = generate_puzzles(4, num_people, seed, max_depth=max_depth, max_width=max_width)
    assert len(puzzles) == 4 and len({puzzle.key for puzzle in puzzles}) == 4
    for puzzle in puzzles:
        assert solve(puzzle) == [puzzle.solution]
        assert _brute_force(puzzle) == [puzzle.solution]
        assert [speaker for speaker, _ in puzzle.statements] == list(range(num_people))
        assert len(set(puzzle.names)) == num_people
        for speaker, statement in puzzle.statements:
            assert _depth(statement) <= max_depth
            assert all(2 <= width <= max_width for width in _widths(statement))
            assert statement != ("knave", speaker)
            # Not a tautology or contradiction: some assignment makes it true, some false.
            values = {evaluate(statement, bits) for bits in itertools.product((False, True), repeat=num_people)}
            assert values == {False, True}
        assert Puzzle.from_dict(json.loads(json.dumps(puzzle.to_dict()))) == puzzle
        # Renderings stay within their bounds and parse back to the solution.
        compact = render_compact_prompt(puzzle)
        assert len(compact) <= compact_prompt_bound(num_people, max_depth, max_width)
        assert set(compact) <= set(string.printable) - set(string.whitespace) | {" "}
        assert parse_compact_answer(render_compact_completion(puzzle.solution), num_people) == puzzle.solution
        chat_completion = render_chat_completion(puzzle)
        assert len(chat_completion) <= chat_completion_bound(num_people)
        assert parse_chat_answer(chat_completion, puzzle.names) == puzzle.solution
        assert logic_rl_score(chat_completion, puzzle) == 3.0
        assert len(render_chat_quiz(puzzle)) < chat_prompt_bound(num_people, max_depth, max_width)


def test_generation_is_reproducible() -> None:
    assert generate_puzzles(20, 3, seed=7) == generate_puzzles(20, 3, seed=7)
    assert generate_puzzles(20, 3, seed=7) != generate_puzzles(20, 3, seed=8)
    assert generate_puzzles(20, 4, seed=7)[:5] == generate_puzzles(5, 4, seed=7)


def test_generation_excludes_keys() -> None:
    first = generate_puzzles(30, 3, seed=1)
    excluded = {puzzle.key for puzzle in first[:10]}
    again = generate_puzzles(30, 3, seed=1, exclude=excluded)
    assert not {puzzle.key for puzzle in again} & excluded
    assert again[:20] == first[10:]


def test_two_person_space_is_small() -> None:
    # 219 distinct two-person puzzles at depth 2: asking for 300 exhausts the space.
    assert len(generate_puzzles(150, 2, seed=0)) == 150
    with pytest.raises(ValueError, match=r"only 219 of count=300 distinct puzzles.*num_people=2"):
        generate_puzzles(300, 2, seed=0)


def _every_statement(speaker: int, num_people: int, depth: int, width: int) -> list:
    """Every statement random_statement can draw, enumerated (children distinct)."""
    leaves = [(kind, who) for kind in LEAF_KINDS for who in range(num_people) if (kind, who) != ("knave", speaker)]
    if depth == 1:
        return leaves
    below = _every_statement(speaker, num_people, depth - 1, width)
    return [*leaves, *(("not", child) for child in below),
            *((kind, children) for kind in ("and", "or") for arity in range(2, width + 1)
              for children in itertools.permutations(below, arity)),
            *((kind, children) for kind in ("iff", "implies") for children in itertools.permutations(below, 2))]


@pytest.mark.parametrize(("num_people", "max_depth", "max_width"), [(2, 2, 2), (2, 3, 2), (3, 2, 3)])
def test_the_puzzle_space_size_equals_an_enumeration_of_every_puzzle(num_people, max_depth, max_width) -> None:
    all_ones, knights = kk._knight_masks(num_people)
    by_truth = []
    for speaker in range(num_people):
        statements = _every_statement(speaker, num_people, max_depth, max_width)
        assert len({render_compact_statement(statement) for statement in statements}) == len(statements)  # distinct
        truths = collections.Counter(kk._truth_mask(statement, all_ones, knights) for statement in statements)
        by_truth.append([(truth, count) for truth, count in truths.items() if truth not in (0, all_ones)])
    unique = 0
    for choice in itertools.product(*by_truth):
        consistent = functools.reduce(operator.and_, (all_ones ^ knights[speaker] ^ truth
                                                      for speaker, (truth, _) in enumerate(choice)), all_ones)
        if consistent and not consistent & (consistent - 1):
            unique += math.prod(count for _, count in choice)
    assert kk.puzzle_space_size(num_people, max_depth, max_width) == unique
    assert kk.puzzle_space_size(2, 2, 2) == 219  # what generate_puzzles exhausts above


def test_a_test_pool_training_could_not_draw_around_is_refused_at_config_validation() -> None:
    """A pool of all 219 two-person puzzles left training nothing: the warm start gave up after 100,000 draws."""
    from dataflex_rl.run_config import parse_train_config

    raw = compose_train_config(["run_dir=x", "task=knights_knaves", "task.num_people=2", "task.test_size=219"])
    with pytest.raises(ConfigError, match=r"task\.test_size = 219 is not allowed: .* 219 for num_people=2; "
                                          r"allowed: test_size <= 109"):
        parse_train_config(raw)
    mixed = {"num_people": [3, 2], "test_size": 220}  # shares 110 and 110: the two-person one is too large
    with pytest.raises(ValueError, match=r"allowed: test_size <= 219"):
        build_task("knights_knaves", mixed)
    task = build_task("knights_knaves", {**mixed, "test_size": 219})
    assert len(task.train_problems(500, seed=1)) == 500


# --- from_dict validation -----------------------------------------------------------------------------------------
def test_to_dict_hand_value() -> None:
    assert WORKED.to_dict() == {
        "num_people": 3,
        "names": ["Zoey", "Oliver", "Ethan"],
        "statements": [
            [0, {"op": "knave", "who": 1}],
            [1, {"op": "iff", "args": [{"op": "knight", "who": 0}, {"op": "knight", "who": 2}]}],
            [2, {"op": "implies", "args": [{"op": "knight", "who": 0}, {"op": "knight", "who": 1}]}],
        ],
        "solution": [True, False, False],
    }


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"num_people": 4}, "names="),
        ({"solution": [True, False]}, "solution="),
        ({"solution": [1, 0, 0]}, "solution="),
        ({"statements": [[3, {"op": "knight", "who": 0}]]}, "person index 3"),
        ({"statements": [[0, {"op": "knight", "who": 5}]]}, "person index 5"),
        ({"statements": [[0, {"op": "xor", "args": []}]]}, "'op' in"),
        ({"statements": [[0, {"op": "iff", "args": [{"op": "knight", "who": 1}]}]]}, "exactly 2"),
        ({"statements": [[0, {"op": "not", "args": [{"op": "knight", "who": 1}]}]]}, "'arg'"),
        ({"statements": [[0]]}, "[speaker_index, statement]"),
        ({"extra": 1}, "must be exactly"),
    ],
)
def test_from_dict_rejects_malformed(change: dict, fragment: str) -> None:
    data = {**WORKED.to_dict(), **change}
    with pytest.raises(ValueError) as error:
        Puzzle.from_dict(data)
    assert fragment in str(error.value)


# --- renderings ---------------------------------------------------------------------------------------------------
def test_compact_rendering_hand_value() -> None:
    assert render_compact_prompt(WORKED) == "A:~B B:A=C C:A>B?"
    assert render_compact_completion(WORKED.solution) == "KNN;"
    nested = _puzzle([(0, ("not", ("or", (KNIGHT_B, ("and", (KNAVE_B, KNIGHT_C))))))], solution=(True, True, True))
    assert render_compact_prompt(nested) == "A:!(B|(~B&C))?"


def test_chat_rendering_hand_value() -> None:
    assert render_chat_quiz(WORKED) == (
        "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves "
        "always lie. You meet 3 inhabitants: Zoey, Oliver, and Ethan. "
        'Zoey said, "Oliver is a knave." '
        'Oliver said, "Zoey is a knight if and only if Ethan is a knight." '
        'Ethan said, "If Zoey is a knight then Oliver is a knight." '
        "So who is a knight and who is a knave?"
    )
    assert render_chat_completion(WORKED).endswith(
        "<answer>\n(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knave\n</answer>"
    )


# --- parsers and rewards ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "parsed"),
    [
        ("KNN;", (True, False, False)),
        ("KNN;KKK junk", (True, False, False)),
        ("KNN", (True, False, False)),  # stopped at EOS
        (" KNN ;", (True, False, False)),
        ("KKK;", (True, True, True)),
        ("KN;", None),  # a person missing
        ("KNNK;", None),  # an extra person
        ("", None),
        (";KNN", None),
        ("KXN;", None),
        ("knn;", None),
        ("K N N;", None),
    ],
)
def test_parse_compact_answer(completion: str, parsed: tuple | None) -> None:
    assert parse_compact_answer(completion, 3) == parsed


CORRECT_LINES = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knave"
WRONG_LINES = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Ethan is a knight"
SOLUTION = (True, False, False)


@pytest.mark.parametrize(
    ("response", "parsed", "valid_format", "logic_rl"),
    [
        # format +1, answer +2
        (f"<think>Oliver lies.</think>\n<answer>\n{CORRECT_LINES}\n</answer>", SOLUTION, True, 3.0),
        (f"<think>x</think><answer>{CORRECT_LINES}</answer> trailing junk", SOLUTION, True, 3.0),
        (
            "<think>x</think><answer>zoey IS A Knight, oliver is a knave, ethan is  a  knave</answer>",
            SOLUTION,
            True,
            3.0,
        ),
        # format +1, answer -1.5 (parsed, wrong)
        (f"<think>x</think><answer>{WRONG_LINES}</answer>", (True, False, True), True, -0.5),
        # format +1, answer -2 (unparsable): wrong name, extra person, missing person, empty, repeated name
        ("<think>x</think><answer>Zoey is a knight\nLiam is a knave\nEthan is a knave</answer>", None, True, -1.0),
        (f"<think>x</think><answer>{CORRECT_LINES}\n(4) Liam is a knave</answer>", None, True, -1.0),
        ("<think>x</think><answer>Zoey is a knight\nOliver is a knave</answer>", None, True, -1.0),
        ("<think>x</think><answer>  </answer>", None, True, -1.0),
        ("<think>x</think><answer>Zoey is a knight\nZoey is a knave\nOliver is a knave</answer>", None, True, -1.0),
        ("<think>x</think><answer>Zoey: knight, Oliver: knave, Ethan: knave</answer>", None, True, -1.0),
        # format -1, answer -2 (skipped): missing or repeated tags, wrong order, empty response
        (f"<answer>{CORRECT_LINES}</answer>", SOLUTION, False, -3.0),
        (f"<think>x<answer>{CORRECT_LINES}</answer>", SOLUTION, False, -3.0),
        (f"<think>a</think><think>b</think><answer>{CORRECT_LINES}</answer>", SOLUTION, False, -3.0),
        (f"<think>x</think><answer>{CORRECT_LINES}</answer><answer>{CORRECT_LINES}</answer>", None, False, -3.0),
        (f"<answer>{CORRECT_LINES}</answer><think>x</think>", SOLUTION, False, -3.0),
        (f"<think>x</think></answer>{CORRECT_LINES}<answer>", None, False, -3.0),
        (f"<think>x</think><answer>{CORRECT_LINES}", None, False, -3.0),
        (CORRECT_LINES, None, False, -3.0),
        ("", None, False, -3.0),
    ],
)
def test_chat_parser_format_and_logic_rl(
    response: str, parsed: tuple | None, valid_format: bool, logic_rl: float
) -> None:
    assert parse_chat_answer(response, WORKED.names) == parsed
    assert has_valid_format(response) is valid_format
    assert logic_rl_score(response, WORKED) == logic_rl


# --- the task -----------------------------------------------------------------------------------------------------
def test_compact_task_rewards() -> None:
    task = build_task("knights_knaves", {"num_people": 3, "test_size": 16})
    problem = task.make_problem(WORKED)
    assert (problem.prompt, problem.completion, problem.difficulty, problem.key) == (
        "A:~B B:A=C C:A>B?", "KNN;", 3, "A:~B B:A=C C:A>B?",
    )  # fmt: skip
    assert problem.answer == WORKED.to_dict()
    cases = {"KNN;": 1.0, "KNN;KKK": 1.0, "KNK;": 0.0, "KN;": 0.0, "": 0.0, "<answer>": 0.0}
    for completion, reward in cases.items():
        assert task.reward(problem, completion) == reward, completion
        assert task.is_correct(problem, completion) is (reward == 1.0)
    assert task.max_completion_chars == 4


def test_chat_task_rewards() -> None:
    logic_rl = build_task("knights_knaves", {"rendering": "chat", "reward": "logic_rl", "test_size": 16})
    binary = build_task("knights_knaves", {"rendering": "chat", "reward": "binary", "test_size": 16})
    problem = logic_rl.make_problem(WORKED)
    assert problem.prompt.endswith("So who is a knight and who is a knave?\nAssistant: ")
    assert logic_rl.reward(problem, problem.completion) == 3.0
    assert binary.reward(problem, problem.completion) == 1.0
    no_think = f"<answer>{CORRECT_LINES}</answer>"
    assert logic_rl.reward(problem, no_think) == -3.0
    assert binary.reward(problem, no_think) == 1.0  # binary only reads the answer block
    assert binary.is_correct(problem, no_think)
    wrong = f"<think>x</think><answer>{WRONG_LINES}</answer>"
    assert (logic_rl.reward(problem, wrong), binary.reward(problem, wrong)) == (-0.5, 0.0)
    assert problem.completion.endswith("</answer>")


@pytest.mark.parametrize("rendering", ["compact", "chat"])
def test_task_problems_within_bounds(rendering: str) -> None:
    task = build_task("knights_knaves", {"num_people": [2, 3, 5], "rendering": rendering, "test_size": 30})
    problems = task.train_problems(60, seed=0)
    assert {problem.difficulty for problem in problems} == {2, 3, 5}
    for problem in problems:
        bound = compact_prompt_bound if rendering == "compact" else chat_prompt_bound
        assert len(problem.prompt) <= bound(5, task.config.max_depth, task.config.max_width)
        assert len(problem.completion) <= task.max_completion_chars
        assert set(problem.prompt + problem.completion) <= set(task.alphabet)
        assert problem.completion.endswith(";" if rendering == "compact" else "</answer>")
        assert task.reward(problem, problem.completion) == 1.0
        assert solve(Puzzle.from_dict(problem.answer)) == [tuple(problem.answer["solution"])]


def test_compact_alphabet_hand_value() -> None:
    task = build_task("knights_knaves", {"num_people": 3, "test_size": 8})
    assert task.alphabet == " !&():;=>?ABCKN|~"


def test_task_reproducible_and_disjoint() -> None:
    task = build_task("knights_knaves", {"num_people": 3, "test_size": 64})
    assert task.train_problems(50, seed=1) == task.train_problems(50, seed=1)
    assert task.train_problems(50, seed=1) != task.train_problems(50, seed=2)
    test_keys = {problem.key for problem in task.test_problems(64, seed=0)}
    assert test_keys == task.test_keys and len(test_keys) == 64
    rng = random.Random(0)
    unfiltered = {task.sample_problem(rng).key for _ in range(3000)}
    assert unfiltered & test_keys  # unfiltered draws do hit the test pool
    for seed in range(3):
        assert not {problem.key for problem in task.train_problems(3000, seed)} & test_keys


def test_mixed_test_pool_is_interleaved_and_fixed() -> None:
    task = build_task("knights_knaves", {"num_people": [3, 4, 5], "test_size": 10})
    assert [problem.difficulty for problem in task.test_pool] == [3, 4, 5, 3, 4, 5, 3, 4, 5, 3]
    assert {p.key for p in task.test_problems(6, seed=0)} == {p.key for p in task.test_problems(6, seed=9)}
    chat = build_task("knights_knaves", {"num_people": [3, 4, 5], "test_size": 10, "rendering": "chat"})
    assert chat.test_keys == task.test_keys  # keys do not depend on the rendering
