"""The cipher task (tasks/cipher.py): a hidden key, all-or-nothing reward, buckets by length, splits."""

from __future__ import annotations

import pytest

from keelrl.tasks import TaskError, get_task
from keelrl.tasks.base import BucketedTask
from keelrl.tasks.cipher import make_key


def test_key_is_a_seeded_permutation() -> None:
    key = make_key(0)
    assert sorted(key) == sorted(key.values()) == list("abcdefghijklmnopqrstuvwxyz")
    assert key == make_key(0) and key != make_key(1)
    task = get_task("cipher", key_seed=1)
    assert task.encode("abca") == make_key(1)["a"] + make_key(1)["b"] + make_key(1)["c"] + make_key(1)["a"]


@pytest.mark.parametrize(
    ("answer", "reward", "letters", "reason"),
    [
        ("{enc}", 1.0, 3, "correct"),
        (" {ENC} ", 1.0, 3, "correct"),  # case and spaces around the word do not matter
        ("{enc0}{enc1}x", 0.0, 2, "wrong_letters"),  # two of three letters earn nothing
        ("{enc}{enc0}", 0.0, 3, "wrong_length"),
        ("{enc0}{enc1}", 0.0, 2, "wrong_length"),
    ],
)
def test_reward_is_all_or_nothing(answer: str, reward: float, letters: int, reason: str) -> None:
    task = get_task("cipher")
    enc = task.encode("qev")
    assert "x" not in enc[2]  # the wrong third letter above is wrong
    text = answer.format(enc=enc, ENC=enc.upper(), enc0=enc[0], enc1=enc[1])
    score = task.score({"word": "qev"}, f"<answer>{text}</answer>")
    assert (score.reward, score.correct, score.info["letters_correct"], score.info["reason"]) == (
        reward,
        reward == 1.0,
        letters,
        reason,
    )
    none = task.score({"word": "qev"}, enc)
    assert (none.reward, none.info["reason"], none.info["formatted"]) == (0.0, "no_answer", False)


def test_buckets_splits_and_reference_answers() -> None:
    task = get_task("cipher", seed=2, min_length=1, max_length=3)
    assert isinstance(task, BucketedTask) and task.buckets() == ["len1", "len2", "len3"]
    for k, bucket in enumerate(task.buckets(), start=1):
        train = [task.problem_in(bucket, "train", i)["word"] for i in range(100)]
        test = [task.problem_in(bucket, "test", i)["word"] for i in range(40)]
        assert {len(w) for w in train + test} == {k}
        assert train == [task.problem_in(bucket, "train", i)["word"] for i in range(100)]  # deterministic
        if k == 1:  # the 26 single letters are the facts themselves: in both splits
            letters = set("abcdefghijklmnopqrstuvwxyz")
            for split in ("train", "test"):
                assert {task.problem_in(bucket, split, i)["word"] for i in range(300)} == letters
        else:
            assert set(train).isdisjoint(test)
        for w in train[:5]:
            p = {"word": w}
            assert task.difficulty(p) == bucket
            assert task.score(p, f"<answer>{task.reference_answer(p)}</answer>").correct
    assert {len(task.problem("train", i)["word"]) for i in range(60)} == {1, 2, 3}
    with pytest.raises(ValueError, match="no difficulty bucket 'len4'"):
        task.problem_in("len4", "train", 0)
    with pytest.raises(TaskError, match="min_length=3 > max_length=2"):
        get_task("cipher", min_length=3, max_length=2)


def test_prompts() -> None:
    task = get_task("cipher")
    compact = task.prompt({"word": "abc"}, "compact")
    assert (compact.system, compact.user, compact.assistant_prefix) == ("", "abc ->", "")
    chat = task.prompt({"word": "abc"}, "chat")
    assert "'abc'" in chat.user and chat.assistant_prefix == "<answer>"
    assert task.encode("abc") not in chat.user  # the key is never shown
