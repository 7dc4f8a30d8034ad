"""SFT data: assistant-only masks (single and multi-turn, chat template and plain), record formats, the
example order, packing boundaries, loss weights with worked numbers, and micro-batch invariance."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from keelrl.algo.logprobs import LogprobModule, block_causal_mask
from keelrl.rollout.chat import chat_format
from keelrl.stages.sft.batches import build_batch, epoch_of, example_weights, pack, step_indices
from keelrl.stages.sft.data import DataError, Example, encode_all, encode_record, is_held_out, read_records
from keelrl.stages.sft.step import row_logprobs

CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture()
def chat_tok(char_tokenizer):
    import copy

    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = CHATML
    return tok


def trained_text(tok, ex: Example) -> list[str]:
    """The trained spans of an example, decoded (runs of label 1), with EOS shown as <eos>."""
    spans, cur = [], []
    for t, lab in zip(ex.ids, ex.labels):
        if lab:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    return [tok.decode(s) for s in spans]


def test_multiturn_chat_mask_trains_only_assistant_turns(chat_tok):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "call calc"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
        {"role": "user", "content": "thanks"},
    ]
    ex = encode_record({"messages": messages}, chat_tok, chat_format("chat", chat_tok), None)
    assert trained_text(chat_tok, ex) == ["call calc<eos>", "It is 4.<eos>"]
    context = chat_tok.decode([t for t, lab in zip(ex.ids, ex.labels) if not lab])
    # everything else is context: system, user, the template's headers, the tool reply; the trailing user
    # turn after the last answer is dropped (nothing to train on)
    assert context.startswith("<|system|>be brief<|end|>\n<|user|>2+2?<|end|>\n<|assistant|>")
    assert "<|tool|>4<|end|>" in context and "thanks" not in context
    assert len(ex.ids) == len(ex.labels)


def test_plain_format_and_prompt_completion_records(char_tokenizer):
    chat = chat_format("base", char_tokenizer)
    ex = encode_record(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        char_tokenizer,
        chat,
        None,
    )
    assert char_tokenizer.decode(ex.ids) == "User: hi\nAssistant:yo<eos>"
    assert trained_text(char_tokenizer, ex) == ["yo<eos>"]
    ex = encode_record(
        {"prompt": "3 4 -> 7\n", "completion": "<answer>3+4</answer>"}, char_tokenizer, chat, None
    )
    assert trained_text(char_tokenizer, ex) == ["<answer>3+4</answer><eos>"]
    assert char_tokenizer.decode(ex.ids[: ex.labels.index(1)]) == "3 4 -> 7\n"
    # a problem record is prompted by the task, exactly as RL prompts it
    ex = encode_record(
        {"problem": {"n": 5}, "completion": "ok"}, char_tokenizer, chat, lambda p: [7] * p["n"]
    )
    assert ex.ids[:5] == [7] * 5 and ex.labels == [0] * 5 + [1] * 3


@pytest.mark.parametrize(
    "record, says",
    [
        ({"text": "x"}, "expected 'messages'"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
        ({"messages": [{"role": "robot", "content": "q"}]}, "role"),
        ({"problem": {"a": 1}, "completion": "x"}, "task.name"),
    ],
)
def test_bad_records_say_what_is_wrong(char_tokenizer, record, says):
    with pytest.raises(DataError, match=says):
        encode_record(
            record, char_tokenizer, chat_format("base", char_tokenizer), None, "data.jsonl record 3"
        )


def test_too_long_policies(char_tokenizer):
    chat = chat_format("base", char_tokenizer)
    records = [{"prompt": "ab", "completion": "cdefgh"}, {"prompt": "a", "completion": "b"}]
    kept, dropped, truncated = encode_all(records, char_tokenizer, chat, None, 5, "drop", "f")
    assert (len(kept), dropped, truncated) == (1, 1, 0)
    kept, dropped, truncated = encode_all(records, char_tokenizer, chat, None, 5, "truncate", "f")
    assert (len(kept), dropped, truncated) == (2, 0, 1) and len(kept[0].ids) == 5
    with pytest.raises(DataError, match="record 0 is 9 tokens"):
        encode_all(records, char_tokenizer, chat, None, 5, "error", "f")


def test_read_formats(tmp_path: Path):
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    assert read_records(tmp_path / "d.jsonl") == rows == read_records(tmp_path / "d.json")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert read_records(tmp_path / "d.parquet") == rows == read_records(tmp_path / "saved")
    run = tmp_path / "run"
    run.mkdir()
    logged = [
        {"step": 1, "problem": {"k": 1}, "text": "good", "correct": True},
        {"step": 1, "problem": {"k": 1}, "text": "good", "correct": True},  # duplicate: kept once
        {"step": 2, "problem": {"k": 2}, "text": "bad", "correct": False},
    ]
    with gzip.open(run / "rollouts.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in logged)
    got = read_records(run)
    assert [(r["problem"], r["completion"]) for r in got] == [({"k": 1}, "good")]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2 is not JSON"):
        read_records(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")


def test_step_order_is_a_function_of_the_step():
    n, b = 5, 3
    seen = [i for s in range(5) for i in step_indices(s, n, b, seed=0, shuffle=True)]  # 15 = 3 epochs
    for e in range(3):
        assert sorted(seen[e * n : (e + 1) * n]) == list(range(n))  # each epoch a permutation
    assert seen[:n] != seen[n : 2 * n]  # reshuffled per epoch
    assert step_indices(3, n, b, 0, False) == [4, 0, 1]  # worked: examples 9, 10, 11 -> 4, 0, 1
    assert epoch_of(4, n, b) == pytest.approx(2.4)
    held = [is_held_out(i, 0, 0.25) for i in range(2000)]
    assert 0.2 < sum(held) / 2000 < 0.3 and held == [is_held_out(i, 0, 0.25) for i in range(2000)]


def test_pack_first_fit_worked_example():
    assert pack([5, 3, 4, 2, 6], 8) == [[0, 1], [2, 3], [4]]  # rows 5+3 | 4+2 | 6
    assert pack([8, 1], 8) == [[0], [1]]
    with pytest.raises(ValueError):
        pack([9], 8)


def test_weights_worked_numbers():
    a = Example([1, 2, 3, 4], [0, 1, 1, 1])  # 3 trained tokens, predicted from positions 0..2
    b = Example([5, 6], [0, 1])  # 1 trained token
    wa, wb = example_weights([a, b], "token_mean", 4.0, 2.0, 10)
    assert wa.tolist() == [0.25, 0.25, 0.25, 0.0] and wb.tolist() == [0.25, 0.0]
    wa, wb = example_weights([a, b], "seq_mean_token_mean", 4.0, 2.0, 10)
    assert wa.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0.0]) and wb.tolist() == [0.5, 0.0]
    wa, _ = example_weights([a, b], "constant", 4.0, 2.0, 10)
    assert wa.tolist() == pytest.approx([0.05, 0.05, 0.05, 0.0])


def test_block_causal_mask():
    m = block_causal_mask(torch.tensor([[0, 0, 1, 1, -1]]))[0, 0].int()
    assert m.tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],  # padding sees itself only
    ]


def _examples(seed: int, n: int) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(2, 90, (L,), generator=g).tolist()
        start = int(torch.randint(1, L - 1, (1,), generator=g))
        out.append(Example(ids, [0] * start + [1] * (L - start)))
    return out


def _loss_and_grad(model, examples, packing: bool, micro: int, mode="token_mean"):
    tokens = float(sum(e.trained_tokens for e in examples))
    batch = build_batch(examples, mode, tokens, float(len(examples)), 24, packing, 0)
    module = LogprobModule(model)
    model.zero_grad()
    total = 0.0
    R = batch.input_ids.shape[0]
    for mb in batch.chunks(micro):
        loss = -(row_logprobs(module, mb) * mb.weights).sum()
        loss.backward()
        total += float(loss.detach())
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()
    return total, grad, R


@pytest.mark.parametrize(
    ("mode", "attn"), [("token_mean", "sdpa"), ("seq_mean_token_mean", "sdpa"), ("token_mean", "eager")]
)
def test_packing_and_micro_batching_do_not_change_loss_or_gradient(tiny_model, mode, attn):
    """Also under eager attention, which adds a 4D mask to the scores: a boolean block mask (True = +1) let
    packed examples see their own future tokens (SFT loss fell to 0.02 while the model learned nothing usable)."""
    import copy

    model = copy.deepcopy(tiny_model).train(False)
    model.set_attn_implementation(attn)
    examples = _examples(0, 7)
    ref_loss, ref_grad, rows = _loss_and_grad(model, examples, False, 7, mode)
    assert rows == 7
    # the loss is the weighted NLL of each example on its own (worked against a per-example forward)
    expect = 0.0
    tokens = sum(e.trained_tokens for e in examples)
    for e in examples:
        ids = torch.tensor([e.ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        nll = -logp[torch.arange(len(e.ids) - 1), ids[0, 1:]]
        m = torch.tensor(e.labels[1:], dtype=torch.float32)
        expect += float((nll * m).sum()) / (
            tokens if mode == "token_mean" else float(m.sum()) * len(examples)
        )
    assert ref_loss == pytest.approx(expect, rel=1e-5)
    for packing, micro in ((False, 1), (False, 3), (True, 1), (True, 7)):
        loss, grad, rows = _loss_and_grad(model, examples, packing, micro, mode)
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)
        if packing:
            assert rows < 7  # several examples share a row


def test_packing_without_boundaries_would_differ(tiny_model):
    """The equality above is not vacuous: attending across packed examples changes the loss."""
    examples = _examples(1, 4)
    batch = build_batch(examples, "token_mean", 1.0, 4.0, 24, True, 0)
    module = LogprobModule(tiny_model)
    with torch.no_grad():
        right = row_logprobs(module, batch)
        leaky, _ = module(
            batch.input_ids, (batch.documents >= 0).long(), batch.target_mask, 1.0, share_prefix=False
        )
    assert (right - leaky).abs().max() > 1e-3
