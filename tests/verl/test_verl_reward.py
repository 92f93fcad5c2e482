"""verl reward function: signature, dispatch, values, rows that survive a parquet round trip."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import pathlib

import pandas as pd
import pytest

from dataflex_rl.tasks import build_task
from dataflex_rl.tasks.arithmetic import make_problem
from dataflex_rl.tasks.knights_knaves import Puzzle, generate_puzzles, render_chat_completion
from dataflex_rl.verl.data import verl_row
from dataflex_rl.verl.reward import compute_score

PUZZLE = Puzzle(
    names=("Zoey", "Oliver"),
    # Zoey: "at least one of us is a knave"; Oliver: "Zoey is a knave" -> Zoey knight, Oliver knave.
    statements=((0, ("or", (("knave", 0), ("knave", 1)))), (1, ("knave", 0))),
    solution=(True, False),
)
TRUTH = json.dumps(PUZZLE.to_dict())
RIGHT = "<think>If Zoey lied, her claim would hold.</think><answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>"
WRONG = "<think>guess</think><answer>(1) Zoey is a knave\n(2) Oliver is a knight</answer>"


def test_signature_matches_verl_default_compute_score() -> None:
    """The first four parameters carry verl's names (read from verl's source, without importing verl)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        pytest.skip("verl is not installed")
    source = pathlib.Path(spec.origin).parent / "utils" / "reward_score" / "__init__.py"
    tree = ast.parse(source.read_text())
    default = next(
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "default_compute_score"
    )
    verl_names = [argument.arg for argument in default.args.args][:4]
    ours = list(inspect.signature(compute_score).parameters)[:4]
    assert verl_names == ours == ["data_source", "solution_str", "ground_truth", "extra_info"]


@pytest.mark.parametrize(
    ("solution_str", "score"),
    [
        (RIGHT, 3.0),  # +1 format, +2 answer
        (WRONG, -0.5),  # +1 format, -1.5 answer
        ("<think>x</think><answer>Zoey is a knight</answer>", -1.0),  # +1 format, -2 unparsable (Oliver missing)
        ("(1) Zoey is a knight\n(2) Oliver is a knave", -3.0),  # -1 format, -2 skipped
    ],
)
def test_knights_knaves_logic_rl(solution_str: str, score: float) -> None:
    # Called as verl's reward managers call it: keywords only, extra_info filled by the manager.
    extra_info = {"num_turns": None, "rollout_reward_scores": {}}
    assert (
        compute_score(
            data_source="knights_knaves", solution_str=solution_str, ground_truth=TRUTH, extra_info=extra_info
        )["score"]
        == score
    )
    decoded = compute_score("knights_knaves", solution_str, PUZZLE.to_dict())  # an already decoded mapping
    assert decoded["score"] == score


def test_knights_knaves_binary_through_reward_kwargs() -> None:
    assert compute_score("knights_knaves", RIGHT, TRUTH, knights_knaves_reward="binary")["score"] == 1.0
    assert compute_score("knights_knaves", WRONG, TRUTH, knights_knaves_reward="binary")["score"] == 0.0
    with pytest.raises(ValueError, match=r"knights_knaves_reward='dense'.*'binary', 'logic_rl'"):
        compute_score("knights_knaves", RIGHT, TRUTH, knights_knaves_reward="dense")


def test_reward_router_arguments_are_accepted() -> None:
    score = compute_score("knights_knaves", RIGHT, TRUTH, {}, reward_router_address="x", reward_model_tokenizer=None)
    assert score == {"score": 3.0, "acc": 1.0}


def test_accuracy_is_reported_beside_the_reward() -> None:
    # verl logs every key of the dict: "acc" is right/wrong whatever the Logic-RL format score.
    assert compute_score("knights_knaves", WRONG, TRUTH) == {"score": -0.5, "acc": 0.0}
    assert compute_score("knights_knaves", "<answer>" + RIGHT.split("<answer>")[1], TRUTH)["acc"] == 1.0
    assert compute_score("arithmetic", "168;", "168") == {"score": 1.0, "acc": 1.0}


@pytest.mark.parametrize(
    ("solution_str", "score"), [("168;", 1.0), ("168;junk", 1.0), ("168", 1.0), ("169;", 0.0), ("", 0.0)]
)
def test_arithmetic(solution_str: str, score: float) -> None:
    assert compute_score("arithmetic", solution_str, "168")["score"] == score
    assert compute_score("arithmetic", solution_str, 168)["score"] == score


def test_errors_name_the_bad_input() -> None:
    with pytest.raises(ValueError, match=r"data_source='gsm8k'.*'arithmetic', 'knights_knaves'"):
        compute_score("gsm8k", "1", "1")
    with pytest.raises(ValueError, match=r"not valid JSON"):
        compute_score("knights_knaves", RIGHT, "{not json")
    with pytest.raises(ValueError, match=r"puzzle keys"):
        compute_score("knights_knaves", RIGHT, json.dumps({"solution": [True, False]}))


def test_rows_survive_parquet_and_score(tmp_path: pathlib.Path) -> None:
    puzzles = generate_puzzles(3, 3, seed=0)
    chat_task = build_task("knights_knaves", {"rendering": "chat", "reward": "logic_rl", "test_size": 4})
    problems = [chat_task.make_problem(puzzle) for puzzle in puzzles]
    rows = [verl_row(problem, "knights_knaves", "train", index) for index, problem in enumerate(problems)]
    rows.append(verl_row(make_problem(123, "+", 45), "arithmetic", "train", 3))
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    loaded = pd.read_parquet(path)
    assert list(loaded["data_source"]) == ["knights_knaves"] * 3 + ["arithmetic"]
    for (_, row), puzzle in zip(loaded.iloc[:3].iterrows(), puzzles, strict=True):
        messages = list(row["prompt"])
        assert [message["role"] for message in messages] == ["system", "user"]
        truth = row["reward_model"]["ground_truth"]
        assert isinstance(truth, str)
        result = compute_score(row["data_source"], render_chat_completion(puzzle), truth, dict(row["extra_info"]))
        assert result["score"] == 3.0
    arithmetic = loaded.iloc[3]
    assert arithmetic["prompt"][0]["content"] == "123+45="
    assert compute_score("arithmetic", "168;", arithmetic["reward_model"]["ground_truth"])["score"] == 1.0
    with pytest.raises(ValueError, match=r"data_source='sudoku'"):
        verl_row(make_problem(1, "+", 1), "sudoku", "train", 0)
