"""The "dataset" task (tasks/dataset.py): data formats and splits, prompts, buckets, and reward functions called
as documented (per sample, async, batched the TRL way, weighted), with every way a function can fail giving
that sample a verifier_error and a sentence, and every way a setting can be wrong a user error saying how."""

from __future__ import annotations

import asyncio
import json
import math
import textwrap
from pathlib import Path
from typing import Any

import datasets
import pytest

from keelrl.config import ConfigError, CurriculumConfig, config_from_dict
from keelrl.curriculum.sources import make_source
from keelrl.rollout.prompts import render_prompt
from keelrl.tasks import TaskError, get_task
from keelrl.tasks.dataset import IN_PROCESS

REWARDS = """
import asyncio, json, math, os

def exact(completion, answer, **row):
    return float(completion.strip() == answer)

def length(completion, **row):
    return len(completion) / 10

def logged(completion, **row):
    with open(os.environ["REWARD_LOG"], "a") as f:
        f.write(json.dumps({"completion": completion, "row": row}) + "\\n")
    return 0.5

IN_FLIGHT = [0, 0]   # calls running now, most at once

async def slow_exact(completion, answer, **row):
    IN_FLIGHT[0] += 1
    IN_FLIGHT[1] = max(IN_FLIGHT)
    await asyncio.sleep(0.01)
    IN_FLIGHT[0] -= 1
    return completion.strip() == answer   # a bool counts as 0 / 1

def trl_style(prompts, completions, answer, **kwargs):   # TRL's batched signature
    return [float(c.strip() == a) + 0.25 * (p[:1] == c[:1]) for p, c, a in zip(prompts, completions, answer)]
trl_style.batched = True

def raises(completion, **row):
    if "boom" in completion:
        raise RuntimeError("the scorer broke")
    return 1.0

def returns(completion, **row):
    values = {"none": None, "nan": math.nan, "text": "0.5", "inf": math.inf, "list": [1.0], "dict": {"acc": 1}}
    return values.get(completion, 2)

def short_batch(prompts, completions, **kw):
    return [1.0]
"""

ROWS = [
    {"prompt": f"{i}+{i}=", "answer": str(2 * i), "level": ("easy", "medium", "hard")[i % 3]}
    for i in range(60)
]


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with sums.jsonl (60 rows) and the reward module `rw` importable."""
    (tmp_path / "rw.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("REWARD_LOG", str(tmp_path / "calls.jsonl"))
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def task(data: Path, **params: Any) -> Any:
    return get_task("dataset", **{"path": str(data / "sums.jsonl"), "reward": "rw:exact", **params})


def test_every_format_loads_the_same_rows(data: Path) -> None:
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(data / "sums.parquet"))
    ds.to_csv(str(data / "sums.csv"), index=False)
    ds.save_to_disk(str(data / "saved"))
    (data / "folder").mkdir()
    (data / "folder" / "train.jsonl").write_text((data / "sums.jsonl").read_text())
    expected = [
        {k: str(v) for k, v in task(data).row(task(data).problem("train", i)).items()} for i in range(9)
    ]
    for path in ("sums.parquet", "sums.csv", "saved", "folder"):  # CSV reads "82" as 82: compared as text
        t = task(data, path=str(data / path))
        assert [{k: str(v) for k, v in t.row(t.problem("train", i)).items()} for i in range(9)] == expected


def test_held_out_fraction_is_deterministic_disjoint_and_kept_by_prompt(data: Path) -> None:
    a, b = task(data, test=0.25), task(data, test=0.25)
    train = {a.problem("train", i)["row"] for i in range(len(a.rows["train"]))}
    test = {a.problem("test", i)["row"] for i in range(a.size("test"))}
    assert train.isdisjoint(test) and len(train) + len(test) == 60 and 5 <= len(test) <= 25
    assert [a.problem("train", i) for i in range(100)] == [b.problem("train", i) for i in range(100)]
    # an epoch visits each training row once, in a shuffled order that differs between epochs
    n = len(train)
    first, second = ([a.problem("train", e * n + i)["row"] for i in range(n)] for e in (0, 1))
    assert sorted(first) == sorted(second) == sorted(train) and first != second
    # test problems are the held-out rows in data order; their problem carries the prompt for people reading
    assert [a.problem("test", i)["row"] for i in range(a.size("test"))] == sorted(test)
    p = a.problem("test", 0)
    assert p == {"split": "test", "row": p["row"], "prompt": ROWS[p["row"]]["prompt"]} and json.dumps(p)
    # a different task seed holds out other rows; duplicated prompts land on one side
    assert {task(data, test=0.25).problem("test", i)["row"] for i in range(3)} != {
        get_task("dataset", seed=7, path=str(data / "sums.jsonl"), reward="rw:exact", test=0.25).problem(
            "test", i
        )["row"]
        for i in range(3)
    }
    (data / "dup.jsonl").write_text(
        "".join(json.dumps({**r, "prompt": r["prompt"][:2]}) + "\n" for r in ROWS)
    )
    dup = task(data, path=str(data / "dup.jsonl"), test=0.3)
    side = {}
    for split in ("train", "test"):
        for i in dup.rows[split]:
            assert side.setdefault(ROWS[i]["prompt"][:2], split) == split


def test_test_split_from_a_split_name_a_file_or_the_data(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_list(ROWS[:40]), test=datasets.Dataset.from_list(ROWS[40:])
    )
    dd.save_to_disk(str(data / "hub"))
    t = task(data, path=str(data / "hub"))  # default: the data's own "test" split
    assert t.size("test") == 20 and t.row(t.problem("test", 0)) == ROWS[40]
    assert task(data, path=str(data / "hub"), test=0.5).size("test") < 40
    (data / "held.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    t = task(data, test=str(data / "held.jsonl"))
    assert t.size("test") == 1 and t.size("train") == 60 and t.problem("test", 5)["row"] == 0
    with pytest.raises(
        TaskError, match=r"task.params.test = 'valid' is not a file, nor a split of .* \(train, test\)"
    ):
        task(data, path=str(data / "hub"), test="valid")
    # no prompt of 60 hashes under 1% with this seed: the lowest is held out, so evals have a row
    assert task(data, test=0.01).size("test") == 1 and task(data, test=0.99).size("train") == 1
    # a split's name wins over a folder of that name in the working directory; "validation" is a default too
    (data / "test").mkdir()
    monkeypatch.chdir(data)
    assert task(data, path=str(data / "hub"), test="test").size("test") == 20
    dd = datasets.DatasetDict(train=dd["train"], validation=dd["test"])
    dd.save_to_disk(str(data / "hub2"))
    assert task(data, path=str(data / "hub2")).size("test") == 20


@pytest.mark.parametrize("n", [1, 2, 3, 12])
def test_a_few_rows_still_hold_one_out(data: Path, n: int) -> None:
    (data / "few.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:n]))
    if n == 1:
        with pytest.raises(
            TaskError, match=r"the (train|test) split is empty \(1 training rows .* as a file"
        ):
            task(data, path=str(data / "few.jsonl"), test=0.5)
        t = task(data, path=str(data / "few.jsonl"), test=str(data / "few.jsonl"))  # the fix it names
        assert t.size("train") == t.size("test") == 1
        return
    for fraction in (0.1, 0.5, 0.9):
        t = task(data, path=str(data / "few.jsonl"), test=fraction)
        assert t.size("train") >= 1 and t.size("test") >= 1 and t.size("train") + t.size("test") == n


def test_wrong_settings_are_user_errors_that_say_what_the_data_holds(data: Path) -> None:
    with pytest.raises(
        TaskError, match=r"prompt_field = 'question' is not a column .* its columns: prompt, answer, level"
    ):
        task(data, prompt_field="question")
    with pytest.raises(
        TaskError, match=r"answer_field = 'solution' is not a column .* prompt, answer, level"
    ):
        task(data, answer_field="solution")
    with pytest.raises(TaskError, match="difficulty_field = 'lvl' is not a column"):
        task(data, difficulty_field="lvl")
    with pytest.raises(TaskError, match=r"split = 'dev'.* has splits train"):
        task(data, split="dev")
    # a local path that is not there is said as such: not wrapped as a load failure with the hub's hint
    with pytest.raises(TaskError, match=r"^\S*missing\.jsonl does not exist; data is \.jsonl"):
        task(data, path=str(data / "missing.jsonl"))
    with pytest.raises(TaskError, match="difficulty_order lacks hard"):
        task(data, difficulty_field="level", difficulty_order=["easy", "medium"])
    (data / "c.jsonl").write_text(json.dumps({"prompt": "x", "completion": "y"}) + "\n")
    with pytest.raises(TaskError, match="column 'completion', which would clash"):
        task(data, path=str(data / "c.jsonl"), test=str(data / "c.jsonl"))
    assert task(data, answer_field="answer")  # the default, present


def test_a_function_the_held_out_files_columns_cannot_call_is_refused_when_built(data: Path) -> None:
    # the held-out file names its reference "solution": rw:exact(completion, answer) could score no test sample
    (data / "held.jsonl").write_text(json.dumps({"prompt": "1+1=", "solution": "2"}) + "\n")
    with pytest.raises(
        TaskError, match=r"exact\(completion, answer, \*\*row\) cannot be called .*\(prompt, solution\)"
    ):
        task(data, test=str(data / "held.jsonl"))


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (
            "no_such_module:f",
            r"task.params.reward: cannot load reward function 'no_such_module:f' \(ModuleNotFoundError",
        ),
        ("rw:nothing", r"task.params.reward: cannot load reward function 'rw:nothing' \(AttributeError"),
        (
            "rw",
            r"task.params.reward: cannot load reward function 'rw' \(ValueError: expected 'module:function'",
        ),
        ("nowhere.py:f", r"task.params.reward: .*FileNotFoundError: no file nowhere.py"),
        ("", r"task.params.reward: no reward function: give task.params.reward as 'package.module:function'"),
        ([{"fn": "rw:exact", "wieght": 2}], r"task.params.reward.0.wieght: Extra inputs are not permitted"),
    ],
)
def test_a_reward_that_cannot_load_is_a_config_error(data: Path, reward: Any, message: str) -> None:
    cfg = {"task": {"name": "dataset", "params": {"path": "anything.jsonl", "reward": reward}}}
    with pytest.raises(ConfigError, match=message):
        config_from_dict(cfg)
    with pytest.raises(TaskError):  # and the same through get_task (keelrl eval, judge)
        task(data, reward=reward)


def test_one_reward_table_not_in_a_list_is_that_function(data: Path) -> None:
    # reward = { fn = "rw:exact", weight = 2 }: one function, not functions named "fn" and "weight"
    t = task(data, reward={"fn": "rw:exact", "weight": 2.0}, test=0.25)
    p = t.problem("train", 0)
    assert t.score(p, t.row(p)["answer"]).reward == 2.0


def test_reward_functions_get_the_completion_and_every_field_and_are_weighted(data: Path) -> None:
    t = task(
        data,
        reward=[{"fn": "rw:exact", "weight": 2.0}, {"fn": "rw:length", "weight": -0.5}, {"fn": "rw:logged"}],
    )
    p = t.problem("train", 3)
    row = ROWS[p["row"]]
    good, bad = t.score_many([p, p], [row["answer"], "nope!"])
    assert good.reward == pytest.approx(2.0 - 0.5 * len(row["answer"]) / 10 + 0.5) and good.correct
    assert good.info["rewards"] == {"exact": 1.0, "length": len(row["answer"]) / 10, "logged": 0.5}
    assert bad.reward == pytest.approx(-0.25 + 0.5) and not bad.correct and bad.status == "ok"
    calls = [json.loads(x) for x in (data / "calls.jsonl").read_text().splitlines()]
    assert calls == [{"completion": row["answer"], "row": row}, {"completion": "nope!", "row": row}]
    assert (
        task(data, correct_at=0.5, reward="rw:logged").score(p, "x").correct
    )  # accuracy: reward >= correct_at


def test_async_functions_are_awaited_concurrently_also_under_a_running_loop(data: Path) -> None:
    t = task(data, reward="rw:slow_exact")
    problems = [t.problem("train", i) for i in range(20)]
    answers = [ROWS[p["row"]]["answer"] if i % 2 else "x" for i, p in enumerate(problems)]
    import rw

    scores = t.score_many(problems, answers)
    assert rw.IN_FLIGHT == [0, 20]  # the 20 calls were awaited together
    assert [s.reward for s in scores] == [float(i % 2) for i in range(20)]

    async def inside_a_loop() -> list[Any]:  # a notebook: an event loop already runs in this thread
        return t.score_many(problems[:2], answers[:2])

    assert [s.reward for s in asyncio.run(inside_a_loop())] == [0.0, 1.0]


def test_batched_functions_are_called_as_trl_calls_them(data: Path) -> None:
    t = task(data, reward="rw:trl_style")
    problems = [t.problem("train", i) for i in range(3)]
    rows = [ROWS[p["row"]] for p in problems]
    scores = t.score_many(problems, [rows[0]["answer"], rows[1]["prompt"][:1] + "?", "z"])
    assert [s.reward for s in scores] == [
        1.0 + 0.25 * (rows[0]["prompt"][0] == rows[0]["answer"][0]),
        0.25,
        0.0,
    ]
    # the TOML flag marks a function as batched too; a wrong count is every sample's error
    t = task(data, reward=[{"fn": "rw:short_batch", "batched": True}])
    scores = t.score_many(problems, ["a", "b", "c"])
    assert all(s.status == "verifier_error" for s in scores)
    assert (
        "batched reward function short_batch returned 1 values for 3 completions" in scores[0].info["error"]
    )


def test_chat_prompts_and_batched_completions_as_messages(data: Path) -> None:
    rows = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}], "answer": "2"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes?"},
                      {"role": "user", "content": "2+2="}], "answer": "4"},
    ]  # fmt: skip
    (data / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen: list[Any] = []

    def spy(prompts: list[Any], completions: list[Any], **kw: Any) -> list[float]:
        seen.extend(completions)
        return [1.0] * len(completions)

    spy.batched = True  # type: ignore[attr-defined]
    IN_PROCESS["spy.pkl"] = spy
    t = task(
        data,
        path=str(data / "chat.jsonl"),
        test=str(data / "chat.jsonl"),
        prompt_field="messages",
        reward="spy.pkl",
    )
    first, second = (t.prompt(t.problem("test", i), "chat") for i in (0, 1))
    assert (first.system, first.user, first.history) == ("Be brief.", "1+1=", ())
    assert (second.system, second.user) == ("", "2+2=")
    assert second.history == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes?"})
    assert t.score(t.problem("test", 0), "2").reward == 1.0 and seen == [
        [{"role": "assistant", "content": "2"}]
    ]


def test_a_chat_message_without_a_role_is_a_task_error_naming_the_row(data: Path) -> None:
    (data / "norole.jsonl").write_text(json.dumps({"prompt": [{"content": "1+1="}], "answer": "2"}) + "\n")
    t = task(data, path=str(data / "norole.jsonl"), test=str(data / "norole.jsonl"))
    with pytest.raises(
        TaskError, match=r"row 0 of the test split: a chat prompt is a list of \{'role', 'content'\}"
    ):
        t.prompt(t.problem("test", 0), "chat")


def test_history_turns_render_before_the_user_turn(char_tokenizer) -> None:
    from keelrl.tasks.base import Prompt

    turns = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes?"})
    text = char_tokenizer.decode(render_prompt(char_tokenizer, Prompt("S", "2+2=", "", turns), "base"))
    assert text == "S\nUser: hi\nAssistant: yes?\nUser: 2+2=\nAssistant: "
    plain = Prompt("S", "2+2=", "")
    assert char_tokenizer.decode(render_prompt(char_tokenizer, plain, "base")) == "S\nUser: 2+2=\nAssistant: "
    assert char_tokenizer.decode(render_prompt(char_tokenizer, plain, "compact")) == "2+2=\n"


@pytest.mark.parametrize(
    ("completion", "error"),
    [
        ("boom", "reward function raises raised RuntimeError: the scorer broke"),
        (
            "list",
            "reward function returns returned '[1.0]' (list), not a finite number (one that scores a whole "
            "batch takes `completions`, or is marked batched)",
        ),
        ("dict", "reward function returns returned \"{'acc': 1}\" (dict), not a finite number"),
        ("nan", "reward function returns returned 'nan' (float), not a finite number"),
        ("inf", "reward function returns returned 'inf' (float), not a finite number"),
        ("text", "reward function returns returned '0.5' (str), not a finite number"),
    ],
)
def test_a_failing_function_leaves_that_sample_unscored_with_a_sentence(
    data: Path, completion: str, error: str
) -> None:
    t = task(data, reward=[{"fn": "rw:raises"}, {"fn": "rw:returns"}])
    p = t.problem("train", 0)
    failed, fine = t.score_many([p, p], [completion, "fine"])
    assert failed.status == "verifier_error" and failed.info["reason"] == "reward_error"
    assert failed.info["error"] == f"{error} (row {p['row']})"
    assert fine.status == "ok" and fine.reward == 3.0 and not math.isnan(fine.reward)


def test_none_means_does_not_apply_and_accuracy_is_the_first_functions(data: Path) -> None:
    """TRL's convention: a function returning None is left out of that sample's weighted sum; a sample no function
    scores has no reward. `correct` is the first function's value >= correct_at, never shaping credit."""
    t = task(data, reward=[{"fn": "rw:returns", "weight": 0.5}, {"fn": "rw:exact", "weight": 2.0}])
    p = t.problem("train", 0)
    answer = ROWS[p["row"]]["answer"]
    skipped, right = t.score_many([p, p], ["none", answer])
    assert (skipped.status, skipped.reward, skipped.correct) == ("ok", 0.0, False)
    assert skipped.info["rewards"] == {"exact": 0.0}  # so reward/fn/returns averages where it applied
    assert (right.reward, right.correct, right.info["rewards"]) == (
        0.5 * 2 + 2.0,
        True,
        {"returns": 2.0, "exact": 1.0},
    )
    alone = task(data, reward="rw:returns").score(p, "none")
    assert alone.status == "verifier_error"
    assert (
        alone.info["error"]
        == f"reward function returns returned None (none applies to this sample) (row {p['row']})"
    )
    shaped = task(data, reward=["rw:exact", "rw:length"]).score(p, "x" * 30)  # 3.0 from length alone
    assert shaped.reward == 3.0 and not shaped.correct
    assert task(data, reward=["rw:length", "rw:exact"]).score(p, "x" * 30).correct  # the first decides


def test_buckets_from_a_column_drive_the_adaptive_curriculum(data: Path) -> None:
    t = task(data, difficulty_field="level", difficulty_order=["easy", "medium", "hard"])
    assert t.buckets() == ["easy", "medium", "hard"]
    assert task(data, difficulty_field="level").buckets() == [
        "easy",
        "hard",
        "medium",
    ]  # sorted without an order
    for bucket in t.buckets():
        drawn = [t.problem_in(bucket, "train", i) for i in range(30)]
        assert {t.difficulty(p) for p in drawn} == {bucket} and {ROWS[p["row"]]["level"] for p in drawn} == {
            bucket
        }
    source = make_source(t, CurriculumConfig(kind="adaptive"), 0)
    problems = [p for _, p in source.next_problems(30)]
    assert {t.difficulty(p) for p in problems} == set(t.buckets())  # a fresh curriculum tries every bucket
    (data / "num.jsonl").write_text(
        "".join(json.dumps({**r, "level": [10, 2, 1][i % 3]}) + "\n" for i, r in enumerate(ROWS))
    )
    assert task(data, path=str(data / "num.jsonl"), difficulty_field="level").buckets() == [
        "1",
        "2",
        "10",
    ]  # by value


def test_reference_answers_and_sizes(data: Path) -> None:
    t = task(data, test=0.2)
    p = t.problem("test", 0)
    assert t.reference_answer(p) == ROWS[p["row"]]["answer"] and t.size("test") == len(t.rows["test"])
    assert task(data, answer_field="level").reference_answer(p) == ROWS[p["row"]]["level"]
