"""Reward-model math and parts with worked numbers: the Bradley-Terry pair loss and its gradient, pair accuracy,
the fixed normalisation and the reward mix RL trains on, what a reward model reads (rm_ids) and where it reads
its score (the last real token, whatever the padding), a fresh head at zero, and the preference records."""

from __future__ import annotations

import math

import pytest
import torch

from keelrl.algo.preference import bradley_terry_loss, combine_rewards, normalise_scores, pair_accuracy
from keelrl.config import ModelConfig
from keelrl.models.load import build_char_tokenizer, load_policy
from keelrl.stages.rm.model import pad_right, reward_scores, rm_ids, score_rows
from keelrl.stages.rm.step import encode_pairs
from keelrl.stages.sft.data import DataError


def test_bradley_terry_loss_worked_numbers_and_gradient() -> None:
    c = torch.tensor([1.0, 0.0, 0.0], requires_grad=True)
    r = torch.tensor([0.0, 0.0, 2.0], requires_grad=True)
    loss = bradley_terry_loss(c, r)
    assert loss.tolist() == pytest.approx(
        [math.log(1 + math.exp(-1)), math.log(2), math.log(1 + math.exp(2))]
    )
    assert loss.tolist() == pytest.approx([0.31326, 0.69315, 2.12693], abs=1e-5)
    loss.sum().backward()
    # d/dc = -(1 - sigmoid(c - r)) = -sigmoid(r - c): the chosen score is pushed up, the rejected one down
    expected = [-1 / (1 + math.e), -0.5, -1 / (1 + math.exp(-2))]
    assert c.grad.tolist() == pytest.approx(expected, abs=1e-6)
    assert r.grad.tolist() == pytest.approx([-g for g in expected], abs=1e-6)
    # only differences matter: a shared offset changes nothing
    assert bradley_terry_loss(c + 5, r + 5).tolist() == pytest.approx(loss.tolist(), abs=1e-6)


def test_pair_accuracy_counts_ties_half() -> None:
    c, r = torch.tensor([2.0, 0.0, 1.0, 1.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert pair_accuracy(c, r) == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert math.isnan(pair_accuracy(torch.tensor([]), torch.tensor([])))


def test_normalise_and_combine_worked_numbers() -> None:
    z = normalise_scores(torch.tensor([3.0, 7.0]), mean=5.0, std=4.0)
    assert z.tolist() == [-0.5, 0.5]
    combined = combine_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 2.0]), 1.0, 0.5)
    assert combined.tolist() == [1.25, 1.0]
    assert combine_rewards(torch.tensor([1.0]), torch.tensor([2.0]), 0.0, 1.0).tolist() == [2.0]
    with pytest.raises(ValueError, match="positive"):
        normalise_scores(torch.tensor([1.0]), 0.0, 0.0)


def test_rm_ids_keeps_the_end() -> None:
    tok = build_char_tokenizer()
    ids, cut = rm_ids(tok, "12 3 -> 15", "<answer>12+3</answer>", 64)
    # no EOS appended: transformers' forward reads the last non-pad token, and EOS is often the pad token
    assert not cut and tok.decode(ids) == "12 3 -> 15<answer>12+3</answer>"
    short, cut = rm_ids(tok, "12 3 -> 15", "<answer>12+3</answer>", 8)
    assert cut and short == ids[-8:]  # the completion's end survives truncation


@pytest.fixture(scope="module")
def reward_model():
    model, tok = load_policy(ModelConfig(path="tiny"), head="reward")
    assert float(model.score.weight.detach().abs().sum()) == 0.0  # a fresh head starts at zero: every score 0
    torch.manual_seed(0)
    with torch.no_grad():
        model.score.weight.normal_()
    return model, tok


def test_score_is_read_at_the_last_real_token_whatever_the_padding(reward_model) -> None:
    model, tok = reward_model
    a = rm_ids(tok, "7 8 -> 1", "<answer>8-7</answer>", 64)[0]
    b = rm_ids(tok, "7 8 -> 56", "<answer>8*7</answer> and more", 64)[0]
    with torch.no_grad():
        alone = [float(reward_scores(model, *pad_right([row], 0))[0]) for row in (a, b)]
    for pad in (0, 5, tok.eos_token_id):  # right padding with any id changes nothing
        ids, lengths = pad_right([a, b], pad)
        with torch.no_grad():
            assert reward_scores(model, ids, lengths).tolist() == pytest.approx(alone, abs=1e-5)
    assert alone[0] != pytest.approx(alone[1], abs=1e-4)
    # batched scoring (sorted by length, several forwards) gives the same scores in the input order
    assert score_rows(model, [b, a, b], 0, 2, torch.device("cpu")).tolist() == pytest.approx(
        [alone[1], alone[0], alone[1]], abs=1e-5
    )


def test_encode_pairs_formats_and_errors() -> None:
    tok = build_char_tokenizer()
    records = [
        {"prompt": "1 2 -> 3", "chosen": "<answer>1+2</answer>", "rejected": "<answer>1*2</answer>", "x": 1},
        {"prompt": "1 2 -> 3", "chosen": "<answer>1+2</answer>" * 5, "rejected": "no"},
    ]
    pairs, dropped, truncated = encode_pairs(records, tok, 40, "drop", "p.jsonl")
    assert len(pairs) == 1 and dropped == 1 and truncated == 0
    pairs, dropped, truncated = encode_pairs(records, tok, 40, "truncate", "p.jsonl")
    assert len(pairs) == 2 and truncated == 1 and len(pairs[1].chosen) == 40
    with pytest.raises(DataError, match=r"record 1 is over data\.max_length=40"):
        encode_pairs(records, tok, 40, "error", "p.jsonl")
    with pytest.raises(DataError, match=r"p.jsonl record 0: .*prompt, chosen and rejected"):
        encode_pairs([{"prompt": "x", "chosen": ["a"], "rejected": "b"}], tok, 40, "drop", "p.jsonl")
