"""The "dataset" task on the material users bring from peers: TRL's own reward functions (imported from the
installed `trl`) and the shapes of its docs' examples, veRL's parquet layout and compute_score signature, GSM8K
and MATH style rows scored with math-verify, and real-world files (CSV with odd quoting, nested and mixed JSONL,
None values, a huge row, unicode, parquet shards, a hub id read offline from the local cache). Reward functions
here are our own equivalents of the peers' published ones, written for these tests."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch

from keelrl.tasks import TaskError, get_task
from keelrl.tasks.dataset import IN_PROCESS


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def build(path: Path, *functions: Any, **params: Any) -> Any:
    """The task on `path`, scored by the given callables (registered in this process, as keelrl.train does)."""
    names = []
    for i, fn in enumerate(functions):
        IN_PROCESS[f"fn{i}.pkl"] = fn
        names.append(f"fn{i}.pkl")
    return get_task("dataset", path=str(path), reward=names, **params)


CHAT = [
    {"prompt": [{"role": "system", "content": "Think, then answer."}, {"role": "user", "content": f"{i} + 1?"}],
     "solution": f"${i + 1}$"}
    for i in range(10)
]  # fmt: skip


def test_trls_own_reward_functions_run_unmarked_on_chat_prompts(tmp_path: Path) -> None:
    pytest.importorskip("math_verify")
    t = get_task(
        "dataset",
        path=str(write_jsonl(tmp_path / "chat.jsonl", CHAT)),
        test=0.3,
        reward=[
            "trl.rewards:accuracy_reward",
            "trl.rewards:think_format_reward",
        ],  # a `completions` parameter
    )
    p = t.problem("train", 0)
    right = "\\boxed{" + t.row(p)["solution"].strip("$") + "}"
    texts = [f"<think>easy</think> {right}", right, "<think>hmm</think> \\boxed{99}", "no idea"]
    scores = t.score_many([p] * 4, texts)
    assert [s.info["rewards"] for s in scores] == [
        {"accuracy_reward": 1.0, "think_format_reward": 1.0},
        {"accuracy_reward": 1.0, "think_format_reward": 0.0},
        {"accuracy_reward": 0.0, "think_format_reward": 1.0},
        {"accuracy_reward": 0.0, "think_format_reward": 0.0},
    ]
    assert [s.reward for s in scores] == [2.0, 1.0, 1.0, 0.0]
    assert [s.correct for s in scores] == [
        True,
        True,
        False,
        False,
    ]  # accuracy: the first function, not format
    # a gold solution math-verify cannot parse: accuracy_reward returns None, TRL skips it, so do we
    write_jsonl(tmp_path / "bad.jsonl", [{**r, "solution": "no number here"} for r in CHAT[:3]])
    bad = get_task(
        "dataset",
        path=str(tmp_path / "bad.jsonl"),
        reward=["trl.rewards:accuracy_reward", "trl.rewards:think_format_reward"],
    )
    s = bad.score(bad.problem("train", 0), texts[0])
    assert (s.status, s.reward, s.correct, s.info["rewards"]) == (
        "ok",
        1.0,
        False,
        {"think_format_reward": 1.0},
    )


def test_trl_docs_shapes_text_and_chat_positional_and_a_hint_for_text_completions(tmp_path: Path) -> None:
    rows = [{"prompt": f"Say {'a' * i}", "ground_truth": "a" * i} for i in range(1, 9)]
    path = write_jsonl(tmp_path / "text.jsonl", rows)

    def length_reward(completions: list[str], **kwargs: Any) -> list[float]:  # the docs' reward_len shape
        return [-abs(4 - len(c)) for c in completions]

    def matches(prompts, completions):  # positional, no **kwargs: called by keyword, given only these two
        return [float(p.removeprefix("Say ") == c) for p, c in zip(prompts, completions)]

    def truth_given(completions: list[str], ground_truth: list[str], **kwargs: Any) -> list[float]:
        assert "prompt" not in kwargs and "prompts" in kwargs  # TRL's: every column but the prompt's
        return [float(c == g) for c, g in zip(completions, ground_truth)]

    t = build(path, matches, length_reward, truth_given, test=0.3)
    p = t.problem("train", 0)
    word = t.row(p)["ground_truth"]
    s = t.score_many([p, p], [word, "abcd"])
    assert s[0].info["rewards"] == {"matches": 1.0, "length_reward": -abs(4 - len(word)), "truth_given": 1.0}
    assert s[1].info["rewards"] == {"matches": float(word == "abcd"), "length_reward": 0, "truth_given": 0.0}

    def chat_style(completions: list[Any], **kwargs: Any) -> list[float]:  # the docs' conversational example
        return [float("a" in c[0]["content"]) for c in completions]

    failed = build(path, chat_style, test=0.3).score(p, "a")  # text prompts give text completions, as in TRL
    assert failed.status == "verifier_error"
    assert "completion[0]['content'] needs chat prompts" in failed.info["error"]
    chat = write_jsonl(
        tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    )
    assert build(chat, chat_style, test=0.3).score(p, "a").reward == 1.0


def test_a_trl_function_that_needs_completion_ids_is_refused_when_the_task_is_built(tmp_path: Path) -> None:
    from trl.rewards import get_soft_overlong_punishment

    path = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    with pytest.raises(
        TaskError, match=r"cannot be called as TRL's .* missing a required argument: 'completion_ids'"
    ):
        build(path, get_soft_overlong_punishment(100, 20))


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = solution_str.split("####")[-1].strip()
    if data_source == "openai/gsm8k":
        return float(answer == ground_truth)
    # a dict, as veRL allows: its "score" is the reward
    return {"score": 0.5 * (answer == ground_truth) + extra_info["bonus"], "acc": answer == ground_truth}
"""


def test_verl_parquet_and_compute_score_run_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        {
            "data_source": "openai/gsm8k" if i % 2 else "lighteval/MATH",
            "prompt": [{"role": "user", "content": f'What is {i} + {i}? Output the answer after "####".'}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i, "bonus": 0.25},
        }
        for i in range(12)
    ]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))  # nested structs, as veRL's
    datasets.Dataset.from_list(rows[:4]).to_parquet(str(tmp_path / "test.parquet"))
    (tmp_path / "reward.py").write_text(VERL_REWARD)
    monkeypatch.chdir(tmp_path)  # veRL's custom_reward_function.path: a file
    t = get_task("dataset", path="train.parquet", test="test.parquet", reward="reward.py:compute_score")
    assert t.size("train") == 12 and t.size("test") == 4
    assert t.prompt(t.problem("test", 1), "chat").user == rows[1]["prompt"][0]["content"]
    gsm, math_ = (t.problem("test", i) for i in (1, 2))
    scores = t.score_many([gsm, gsm, math_, math_], ["so #### 2", "#### 3", "#### 4", "#### 5"])
    assert [s.reward for s in scores] == [1.0, 0.0, 0.75, 0.25]
    assert [s.correct for s in scores] == [True, False, False, False]  # correct_at 1.0

    # veRL's gsm8k scorer shape (no data_source, extra keywords with defaults) on GSM8K rows: ground_truth from
    # answer_field when there is no reward_model column
    def gsm8k_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
        final = ground_truth.split("####")[-1].strip()
        return score if solution_str.split("####")[-1].strip() == final else format_score

    gsm8k = [{"question": f"{i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"} for i in range(10)]
    g = build(write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k), gsm8k_score, prompt_field="question", test=0.3)
    p = g.problem("train", 0)
    assert g.score_many([p, p], [f"#### {g.row(p)['answer'].split()[-1]}", "#### x"])[0].reward == 1.0


MATH_REWARD = """
from math_verify import parse, verify

def boxed_equal(completion, solution, **row):   # MATH rows: the reference is the solution's \\boxed{}
    return float(verify(parse(solution), parse(completion)))
"""


def test_math_rows_scored_with_math_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("math_verify")
    rows = [
        {"problem": f"Simplify $\\frac{{{2 * i}}}{{{2 * i + 2}}}$.", "solution": f"It is $\\boxed{{\\frac{{{i}}}{{{i + 1}}}}}$.",
         "level": f"Level {i % 5 + 1}", "type": "Algebra"}
        for i in range(1, 11)
    ]  # fmt: skip
    (tmp_path / "math_rw.py").write_text(textwrap.dedent(MATH_REWARD))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    t = get_task(
        "dataset",
        path=str(path),
        prompt_field="problem",
        difficulty_field="level",
        reward="math_rw:boxed_equal",
    )
    p = t.problem("train", 0)
    i = rows.index(t.row(p)) + 1
    scores = t.score_many(
        [p] * 3, [f"\\boxed{{\\frac{{{i}}}{{{i + 1}}}}}", f"$\\frac{{{2 * i}}}{{{2 * i + 2}}}$", "\\boxed{7}"]
    )
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0]
    assert t.buckets() == [f"Level {k}" for k in range(1, 6)]


def test_reward_callables_as_people_write_them(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)])

    class Judge:
        def __init__(self, bonus: float) -> None:
            self.bonus = bonus

        def method(self, completion: str, answer: str) -> float:  # no **row: given only what it names
            return self.bonus + (completion == answer)

        def __call__(self, completion: str, **row: Any) -> np.float32:
            return np.float32(0.5)

    def scaled(completion: str, answer: str, scale: float = 1.0, **row: Any) -> torch.Tensor:
        return torch.tensor(scale * (completion == answer))

    async def fails(completion: str, **row: Any) -> float:
        raise RuntimeError("judge unreachable")

    t = build(
        path,
        Judge(0.25).method,
        Judge(0),
        functools.partial(scaled, scale=3.0),
        lambda completion, **r: 1,
        lambda completion, **r: True,
        test=0.3,
    )
    p = t.problem("train", 0)
    s = t.score(p, t.row(p)["answer"])
    assert s.info["rewards"] == {
        "method": 1.25,
        "Judge": 0.5,
        "scaled": 3.0,
        "<lambda>": 1.0,
        "<lambda>_4": 1.0,
    }
    assert s.reward == 6.75 and s.correct
    broken = build(path, fails, test=0.3).score(p, "x")
    assert (
        broken.info["error"]
        == f"reward function fails raised RuntimeError: judge unreachable (row {p['row']})"
    )

    def positional_prompt(prompt, completion):  # the completion comes first: this cannot be called right
        return 1.0

    def wrong_field(completion, solution):  # the column is "answer"
        return 1.0

    with pytest.raises(
        TaskError,
        match=r"positional_prompt\(prompt, completion\) cannot be called as fn\(completion, \*\*row\) .* multiple values for argument 'prompt'",
    ):
        build(path, positional_prompt, test=0.3)
    with pytest.raises(
        TaskError,
        match=r"wrong_field\(completion, solution\) .*columns \(prompt, answer\): missing a required argument: 'solution'",
    ):
        build(path, wrong_field, test=0.3)


def test_real_world_files(tmp_path: Path) -> None:
    import csv

    with open(tmp_path / "odd.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt", "answer", "note"])
        for i in range(8):
            w.writerow([f'Say "hi", then\n{i}; ünïcødé 🚀', f"{i:03d}", "" if i % 2 else "N/A,x"])
    t = build(tmp_path / "odd.csv", lambda completion, **row: 1.0, test=str(tmp_path / "odd.csv"))
    first = t.row(t.problem("test", 0))
    assert first == {
        "prompt": 'Say "hi", then\n0; ünïcødé 🚀',
        "answer": "000",
        "note": "N/A,x",
    }  # as written
    assert t.row(t.problem("test", 1))["note"] == ""
    nested = [{"prompt": f"p{i} é", "answer": i if i % 2 else f"x{i}", "meta": None if i % 3 else {"tags": ["a"] * i}}
              for i in range(9)]  # fmt: skip
    nested[4]["prompt"] = "word " * 300_000  # a 1.5 MB row
    t = build(write_jsonl(tmp_path / "nested.jsonl", nested), lambda completion, **row: 1.0, test=0.3)
    by_prompt = {
        t.row({"split": "train", "row": i})["prompt"]: t.row({"split": "train", "row": i}) for i in range(9)
    }
    assert [by_prompt[r["prompt"]] for r in nested] == nested  # native types: mixed, None, nested, unicode
    # (datasets reads a mixed column as its Json feature, where the text "1" comes back as the number 1)
    # None prompts are found when the task is built, with the row; a broken line names its row and cause
    write_jsonl(tmp_path / "holes.jsonl", [{"prompt": "a"}, {"prompt": None}, {"prompt": "c"}])
    with pytest.raises(
        TaskError, match=r"prompt_field = 'prompt' holds NoneType in row 1 .* \(1 rows hold None\)"
    ):
        build(tmp_path / "holes.jsonl", lambda completion, **row: 1.0)
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(TaskError, match=r"cannot load data set .*DatasetGenerationError.*JSON parse error"):
        build(tmp_path / "broken.jsonl", lambda completion, **row: 1.0)
    # a hub snapshot's parquet shards: the folder (splits from the file names) or a glob
    data = datasets.Dataset.from_list([{"prompt": f"s{i}", "answer": str(i)} for i in range(30)])
    (tmp_path / "hub" / "data").mkdir(parents=True)
    for name, rows in (
        ("train-00000-of-00002", range(15)),
        ("train-00001-of-00002", range(15, 30)),
        ("test-00000-of-00001", range(5)),
    ):
        data.select(rows).to_parquet(str(tmp_path / "hub" / "data" / f"{name}.parquet"))
    t = build(tmp_path / "hub", lambda completion, **row: 1.0)
    assert (t.size("train"), t.size("test")) == (30, 5)
    t = build(tmp_path / "hub" / "data" / "train-*.parquet", lambda completion, **row: 1.0, test=0.2)
    assert t.size("train") + t.size("test") == 30


CACHE = """
import os, shutil, sys
import datasets
from datasets.packaged_modules.json.json import Json

# what a download of the hub data set "someone/sums" (configuration "main") leaves in the datasets cache
files = datasets.data_files.DataFilesDict.from_patterns({"train": ["train.jsonl"], "test": ["test.jsonl"]}, base_path=sys.argv[1])
builder = Json(data_files=files, dataset_name="sums", config_name="main", hash="0123abcd")
builder.download_and_prepare()
root = os.environ["HF_DATASETS_CACHE"]
os.makedirs(f"{root}/someone___sums", exist_ok=True)
shutil.move(os.path.dirname(os.path.dirname(builder.cache_dir)), f"{root}/someone___sums/main")
"""
LOAD = """
import json
from keelrl.tasks import get_task
t = get_task("dataset", path="someone/sums", subset="main", reward="rw.py:one")
print(json.dumps([t.size("train"), t.size("test"), t.row(t.problem("test", 0))]))
"""


def test_a_hub_id_loads_offline_from_the_local_cache(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(12)]
    write_jsonl(tmp_path / "train.jsonl", rows[:9])
    write_jsonl(tmp_path / "test.jsonl", rows[9:])
    (tmp_path / "rw.py").write_text("def one(completion, **row):\n    return 1.0\n")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "home")}
    built = subprocess.run(
        [sys.executable, "-c", CACHE, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, built.stderr
    offline = {**env, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", LOAD], env=offline, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [9, 3, rows[9]]


def test_a_folder_of_csv_files_reads_cells_as_text_like_a_csv_file(tmp_path: Path) -> None:
    import csv

    (tmp_path / "csvs").mkdir()
    for split, n in (("train", 6), ("test", 2)):
        with open(tmp_path / "csvs" / f"{split}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt", "answer", "note"])
            for i in range(n):
                w.writerow([f"{split} {i}", f"{i:03d}", "" if i % 2 else "NA"])
    t = build(tmp_path / "csvs", lambda completion, **row: 1.0)
    assert (t.size("train"), t.size("test")) == (6, 2)
    assert [t.row({"split": "test", "row": i}) for i in range(2)] == [
        {"prompt": "test 0", "answer": "000", "note": "NA"},
        {"prompt": "test 1", "answer": "001", "note": ""},
    ]  # as written, as for a CSV file named itself (not 0 and None)
