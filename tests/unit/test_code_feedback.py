"""code_feedback and countdown_tools, driven by scripted turns: feedback from the public tests, retries, the
hidden tests decide; the calculator tool and the answer turn."""

from __future__ import annotations

from typing import Any

import pytest

from keelrl.tasks import get_task
from keelrl.tasks.countdown import solve
from keelrl.tasks.env import EpisodeState, episode_score, play_text


def play(env: Any, problem: dict, turns: list[str]) -> tuple[EpisodeState, list]:
    _, state, results = play_text(env, problem, turns)
    return state, results


def block(code: str) -> str:
    return f"Here it is.\n```python\n{code}\n```"


@pytest.fixture(scope="module")
def feedback() -> Any:
    return get_task("code_feedback", seed=0, attempts=2)


def test_public_feedback_then_a_fix_scores_on_hidden_tests(feedback: Any) -> None:
    problem = next(p for i in range(40) if len((p := feedback.problem("train", i))["tests"]) > 2)
    public, hidden = feedback.split_tests(problem)
    assert len(public) == 2 and hidden == problem["tests"][2:]
    wrong = block(f'def {problem["entry_point"]}(*args, **kwargs):\n    raise RuntimeError("not yet")')
    state, results = play(feedback, problem, [wrong, block(problem["reference"])])
    first = results[0]
    assert not first.done and first.messages[0]["role"] == "user"
    assert first.messages[0]["content"].startswith("0/2 public tests passed")
    assert "RuntimeError" in first.messages[0]["content"]
    assert results[1].done and results[1].info["public_passed"] == 2
    score = episode_score(feedback, state)
    assert (score.reward, score.correct, score.info["attempts"], score.info["total"]) == (
        1.0,
        True,
        2,
        len(hidden),
    )


def test_attempts_run_out_and_the_last_submission_is_scored(feedback: Any) -> None:
    problem = feedback.problem("train", 1)
    wrong = block(f'def {problem["entry_point"]}(*args, **kwargs):\n    raise RuntimeError("not yet")')
    state, results = play(feedback, problem, [wrong, wrong, block(problem["reference"])])
    assert len(results) == 2 and results[-1].done  # attempts = 2
    score = episode_score(feedback, state)
    assert (score.reward, score.correct) == (0.1, False)  # a code block that fails the hidden tests
    # a turn without code ends the episode; nothing submitted scores 0
    state, results = play(feedback, problem, ["I do not know."])
    assert results[0].done and episode_score(feedback, state).reward == 0.0


def test_countdown_tools_calculator_and_answer() -> None:
    env = get_task("countdown_tools", seed=0, min_numbers=3, max_numbers=3, max_number=9)
    problem = env.problem("train", 0)
    expr = solve(problem["numbers"], problem["target"])
    assert expr is not None
    calls = (
        f"<tool_call>calc: {expr}</tool_call>"
        + '<tool_call>{"name": "calc", "arguments": {"expression": "7/2"}}</tool_call>'
    )
    calls += "<tool_call>calc: 2**10</tool_call>"
    state, results = play(env, problem, [calls, f"<answer>{expr}</answer>"])
    replies = [m["content"] for m in results[0].messages]
    assert replies[:2] == [str(problem["target"]), "7/2"] and replies[2].startswith("error:")
    assert results[0].info == {"tool_calls": 3, "tool_errors": 1} and not results[0].done
    assert results[1].done
    score = episode_score(env, state)
    assert (score.reward, score.correct) == (1.0, True)
    # the answer turn is what is scored: a wrong one gets Countdown's format credit only
    state, _ = play(env, problem, ["<answer>1+1</answer>"])
    assert (episode_score(env, state).reward, episode_score(env, state).correct) == (0.1, False)
