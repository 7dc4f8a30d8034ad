"""Multi-turn episodes (rollout/multiturn.py, rollout/chat.py, tasks/env.py, tasks/tools.py): the trained tokens
are the sampled tokens, environment tokens are context only, budgets end episodes with their reasons,
results do not depend on batching or threads, and tool errors never raise."""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from keelrl.config import EpisodeConfig, TinyModelConfig
from keelrl.models.load import build_tiny_model
from keelrl.rollout import Generation, SamplingSettings
from keelrl.rollout.chat import PlainFormat, TemplateFormat
from keelrl.rollout.episodes import Episode
from keelrl.rollout.multiturn import episode_errors, run_multiturn, turn_seed
from keelrl.tasks.base import Score
from keelrl.tasks.env import EpisodeState, StepResult
from keelrl.tasks.tools import run_tool_calls, tool

CHATML = (
    "{%- if messages[0].role == 'system' or tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}{% endif %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MERGES = [("h", "e"), ("he", "l"), ("l", "o"), ("hel", "lo"), ("o", "\n")]


def bpe_tokenizer() -> Any:
    """Characters plus a few merges ("hello" is one token, and so is "o\\n"), ChatML special tokens and template:
    small enough to know exactly how text tokenizes."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|im_end|>": 0, "<|im_start|>": 1, "<unk>": 2}
    for ch in string.printable[:95] + "\n":
        vocab.setdefault(ch, len(vocab))
    for a, b in MERGES:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<|im_end|>", "<|im_start|>", "<unk>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<unk>"
    )
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def tok() -> Any:
    return bpe_tokenizer()


def ids(tok: Any, *pieces: str) -> list[int]:
    """Each piece as ONE token (a vocabulary entry), not as the tokenizer would split the joined text."""
    return [tok.convert_tokens_to_ids(p) for p in pieces]


@dataclass
class ScriptedSampler:
    """Returns scripted turns by seed (`turn_seed(episode seed, turn)`); records what it was asked."""

    script: dict[int, list[int]]
    eos: int
    calls: list[tuple[list[int], int, int]] = field(default_factory=list)  # (prompt, seed, max_new_tokens)
    policy_version: int = 7

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int]
    ) -> list[Generation]:
        out = []
        for p, s in zip(prompts, seeds):
            self.calls.append((list(p), s, settings.max_new_tokens))
            want = self.script[s]
            got = want[: settings.max_new_tokens]
            finish = "eos" if got and got[-1] == self.eos else "length"
            out.append(Generation(got, [-0.5 - 0.01 * i for i in range(len(got))], finish))
        return out

    def update_weights(self, weights: Any, version: int) -> None: ...


class EchoEnv:
    """Replies to each turn with a fixed tool message; done after `turns` turns; reward = turns taken."""

    name = "echo"

    def __init__(self, reply: str = "o\nlo", turns: int = 3) -> None:
        self.reply, self.turns = reply, turns
        self.seen: list[str] = []

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return {"i": index}

    def difficulty(self, problem: dict[str, Any]) -> str:
        return "all"

    def reset(self, problem: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"go {problem['i']}"}]

    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        self.seen.append(assistant_turn)
        done = state.turn >= self.turns
        return StepResult(
            [] if done else [{"role": "tool", "content": self.reply}], 0.25, done, {"correct": done}
        )

    def finish(self, state: EpisodeState) -> Score:
        said = [m["content"] for m in state.messages if m["role"] == "assistant"]
        return Score(0.0, bool(state.infos and state.infos[-1]["correct"]), {"said": said})


WIDE = EpisodeConfig(max_turns=8, max_context_tokens=4096, workers=4)


def play(tok, fmt, env, script, seeds=(11,), limits=WIDE, max_new=16):
    sampler = ScriptedSampler(script, tok.eos_token_id)
    episodes = [Episode(i, env.problem("train", i), i, s) for i, s in enumerate(seeds)]
    rollouts = run_multiturn(sampler, tok, fmt, env, episodes, SamplingSettings(max_new), limits)
    return rollouts, episode_errors(rollouts), sampler


@pytest.mark.parametrize("fmt_name", ["plain", "chat"])
def test_trained_ids_are_the_sampled_ids_byte_for_byte(tok, fmt_name) -> None:
    """Turns sampled as non-canonical tokens ("hel" "lo", where the tokenizer writes "hello") and a reply
    ("o\\nlo...") that merges with the model's text when tokenized together: the mask-1 ids are exactly the
    sampled ids, the mask-0 ids are the reply tokenized on its own, and the log-probs are the sampler's."""
    fmt = PlainFormat(tok) if fmt_name == "plain" else TemplateFormat(tok)
    eos = tok.eos_token_id
    turns = [
        [*ids(tok, "hel", "lo", "h"), eos],
        [*ids(tok, "h", "o"), eos],
        [*ids(tok, "he", "l", "l", "o"), eos],
    ]
    script = {turn_seed(11, k + 1): t for k, t in enumerate(turns)}
    env = EchoEnv()
    (r,), errors, sampler = play(tok, fmt, env, script)
    assert errors == [] and r.finish_reason == "done" and r.info["turns"] == 3
    mask = torch.tensor(r.trainable, dtype=torch.bool)
    completion = torch.tensor(r.completion_ids)
    assert completion[mask].tolist() == [t for turn in turns for t in turn]
    assert torch.tensor(r.sample_logprobs)[mask].tolist() == pytest.approx(
        [-0.5 - 0.01 * i for turn in turns for i in range(len(turn))]
    )
    assert torch.tensor(r.sample_logprobs)[~mask].abs().sum() == 0
    # the sequence is opening + turn + reply + turn + reply + turn, each reply tokenized alone
    opening = fmt.opening(env.reset({"i": 0}, 11))
    reply = fmt.reply(env.reset({"i": 0}, 11), [{"role": "tool", "content": "o\nlo"}], eos)
    assert r.prompt_ids == opening
    assert r.completion_ids == turns[0] + reply + turns[1] + reply + turns[2]
    # each turn was sampled on exactly the sequence trained on (the model's context is the trained context)
    assert [c[0] for c in sampler.calls] == [
        opening,
        opening + turns[0] + reply,
        opening + turns[0] + reply + turns[1] + reply,
    ]
    # teeth: re-tokenizing the decoded text would have changed the trained ids
    text = tok.decode(r.completion_ids)
    assert tok(text, add_special_tokens=False)["input_ids"] != r.completion_ids
    assert env.seen == ["helloh", "ho", "hello"]  # the environment reads the decoded turns
    if fmt_name == "chat":  # the template's <|im_end|> is the model's own stop token: not written twice
        assert reply[0] != eos and tok.decode(reply).startswith("\n<|im_start|>tool\no\nlo<|im_end|>")


def test_reply_merging_with_the_model_text_stays_separate(tok) -> None:
    """The plain format's reply starts with a newline; the model's turn ends with "o" then its stop token. Had
    the turn's text and the reply been tokenized together, "o\\n" would be one token."""
    fmt = PlainFormat(tok)
    eos = tok.eos_token_id
    script = {turn_seed(3, 1): [*ids(tok, "h", "o"), eos], turn_seed(3, 2): [*ids(tok, "o"), eos]}
    (r,), _, _ = play(tok, fmt, EchoEnv(turns=2), script, seeds=(3,))
    joined = tok("ho" + "\nTool: o\nlo\nAssistant:", add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("o\n") in joined  # the hazard is real for this tokenizer
    mask = torch.tensor(r.trainable, dtype=torch.bool)
    assert torch.tensor(r.completion_ids)[mask].tolist() == [*ids(tok, "h", "o"), eos, *ids(tok, "o"), eos]


def test_tools_reach_the_model_through_the_template_or_the_system_text(tok) -> None:
    """A template that renders `tools=` gets them there; one that ignores them (SmolLM2's GGUF template) gets
    the tool list in the system text instead, in the opening and in every reply's rendering alike."""
    calc = tool(lambda expression: expression, name="calc", description="Evaluate arithmetic.")
    opening = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    with_tools = tok.decode(TemplateFormat(tok, [calc]).opening(opening))
    assert "Tools: calc" in with_tools and "Call a tool with" not in with_tools
    plain = bpe_tokenizer()
    plain.chat_template = CHATML.replace("{% if tools %}", "{% if false %}").replace(" or tools", "")
    fmt = TemplateFormat(plain, [calc])
    text = plain.decode(fmt.opening(opening))
    assert "be brief\n\nTools:\n- calc(expression: string): Evaluate arithmetic." in text
    reply = fmt.reply(opening, [{"role": "tool", "content": "4"}], plain.eos_token_id)
    assert plain.decode(reply) == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"


def test_budgets_end_episodes_with_their_reason(tok) -> None:
    fmt, eos = PlainFormat(tok), tok.eos_token_id
    long_turn = ids(tok, "h") * 30 + [eos]
    short = [*ids(tok, "h", "o"), eos]
    # turns: the environment never says done within max_turns
    (r,), _, s = play(
        tok,
        fmt,
        EchoEnv(turns=99),
        {turn_seed(1, k): short for k in (1, 2)},
        (1,),
        EpisodeConfig(max_turns=2, max_context_tokens=4096, workers=1),
    )
    assert r.finish_reason == "turns" and r.info["turns"] == 2 and len(s.calls) == 2
    assert r.trainable[-1] == 1  # no reply after the last turn
    # length: a turn uses all of max_new_tokens
    (r,), _, _ = play(tok, fmt, EchoEnv(), {turn_seed(2, 1): long_turn}, (2,), max_new=16)
    assert r.finish_reason == "length" and sum(r.trainable) == 16
    assert r.info["said"] == ["h" * 16]  # the cut turn is not stepped, but `finish` sees it
    # context: the second turn is capped by what is left of the episode's budget, and runs out
    opening = len(fmt.opening(EchoEnv().reset({"i": 0}, 5)))
    reply = len(fmt.reply([], [{"role": "tool", "content": "o\nlo"}], eos))
    budget = opening + len(short) + reply + 5
    script = {turn_seed(5, 1): short, turn_seed(5, 2): long_turn}
    (r,), _, s = play(
        tok,
        fmt,
        EchoEnv(),
        script,
        (5,),
        EpisodeConfig(max_turns=8, max_context_tokens=budget, workers=1),
        max_new=16,
    )
    assert s.calls[-1][2] == 5 and r.finish_reason == "context"
    assert len(r.prompt_ids) + len(r.completion_ids) == budget
    # context: a reply that does not fit is dropped and ends the episode
    (r,), _, _ = play(
        tok,
        fmt,
        EchoEnv(),
        {turn_seed(6, 1): short},
        (6,),
        EpisodeConfig(max_turns=8, max_context_tokens=opening + len(short) + 2, workers=1),
    )
    assert r.finish_reason == "context" and r.completion_ids == short


def test_results_do_not_depend_on_batching_or_threads(tok) -> None:
    fmt, eos = PlainFormat(tok), tok.eos_token_id
    seeds = list(range(20, 26))
    script = {turn_seed(s, k): ids(tok, "h") * (1 + (s + k) % 4) + [eos] for s in seeds for k in range(1, 4)}
    together, _, _ = play(
        tok, fmt, EchoEnv(), script, seeds, EpisodeConfig(max_turns=8, max_context_tokens=4096, workers=6)
    )
    for s, want in zip(seeds, together):
        (alone,), _, _ = play(
            tok, fmt, EchoEnv(), script, (s,), EpisodeConfig(max_turns=8, max_context_tokens=4096, workers=1)
        )
        assert alone.completion_ids == want.completion_ids and alone.trainable == want.trainable


class RaisingEnv(EchoEnv):
    def step(self, state: EpisodeState, assistant_turn: str) -> StepResult:
        if state.problem["i"] == 1:
            raise RuntimeError("environment bug")
        return super().step(state, assistant_turn)

    def finish(self, state: EpisodeState) -> Score:
        if state.problem["i"] == 2:
            raise KeyError("scorer bug")
        return Score(1.0, True, {"formatted": True})


def test_environment_errors_score_zero_and_never_stop_the_batch(tok) -> None:
    fmt, eos = PlainFormat(tok), tok.eos_token_id
    script = {turn_seed(s, k): [*ids(tok, "h"), eos] for s in (0, 1, 2) for k in range(1, 4)}
    rollouts, errors, _ = play(tok, fmt, RaisingEnv(), script, (0, 1, 2))
    assert [r.reward for r in rollouts] == [0.75 + 1.0, 0.0, 0.0]  # step shaping + finish for episode 0
    assert [r.info.get("reason") for r in rollouts] == [None, "env_error", "score_error"]
    assert len(errors) == 2 and "environment bug" in errors[0] and "scorer bug" in errors[1]


def test_tool_calls_parse_run_and_count_errors() -> None:
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    def boom(text: str) -> str:
        """Always raises."""
        raise ZeroDivisionError("no")

    tools = [tool(add), tool(shout), tool(boom)]
    assert tools[0].schema()["function"]["parameters"] == {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]
    }  # fmt: skip
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        "<tool_call>shout: hi there</tool_call>"
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        "<tool_call>nosuch: 1</tool_call>"
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        "<tool_call>boom: x</tool_call>"
        "<tool_call>add: 3</tool_call>"
        "<tool_call>shout: unclosed"
    )
    replies = run_tool_calls(text, tools)
    contents = [m["content"] for m in replies.messages]
    assert contents[:3] == ["5", "HI THERE", "2"]
    assert all(c.startswith("error:") for c in contents[3:])
    assert "not valid JSON" in contents[3] and "no tool named 'nosuch'" in contents[4]
    assert (
        "bad arguments" in contents[5]
        and "ZeroDivisionError" in contents[6]
        and "takes 2 arguments" in contents[7]
    )
    assert "without its </tool_call>" in contents[8]
    assert (replies.calls, replies.errors) == (9, 6)
    assert run_tool_calls("no calls here", tools).calls == 0


def test_a_real_model_samples_the_trained_tokens(tok) -> None:
    """The in-process sampler over a tiny model: mask-1 ids equal what the sampler returned, turn by turn,
    and the sampling log-probs match a fresh forward over the trained sequence (the context is exact)."""
    from keelrl.algo.logprobs import completion_logprobs
    from keelrl.recipes.demo import pretrain
    from keelrl.rollout.hf import HFSampler

    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, max_positions=512),
        len(tok),
        tok.eos_token_id,
    )
    pretrain(
        model,
        tok,
        lambda i: "Tool: o\nlo\nAssistant:" + "lo" * (i % 3),
        steps=40,
        batch_size=16,
        lr=1e-2,
        seed=0,
    )
    model.eval()  # it now ends its turns within a few tokens, so episodes take several turns
    inner = HFSampler(model, tok)
    got: list[list[int]] = []

    class Recording:
        policy_version = 0

        def generate(self, prompts, settings, seeds):
            out = inner.generate(prompts, settings, seeds)
            got.extend(g.completion_ids for g in out)
            return out

    episodes = [Episode(i, {"i": i}, i, 100 + i) for i in range(4)]
    env = EchoEnv(turns=3)
    rollouts = run_multiturn(
        Recording(),
        tok,
        PlainFormat(tok),
        env,
        episodes,
        SamplingSettings(6),
        EpisodeConfig(max_turns=3, max_context_tokens=400, workers=2),
    )
    for r in rollouts:
        mask = torch.tensor(r.trainable, dtype=torch.bool)
        sampled = torch.tensor(r.completion_ids)[mask].tolist()
        assert any(sampled[: len(g)] == g for g in got)
        ids_ = torch.tensor([r.prompt_ids + r.completion_ids])
        target = torch.zeros_like(ids_, dtype=torch.float32)
        P = len(r.prompt_ids)
        target[0, P - 1 : P - 1 + len(r.completion_ids)] = torch.tensor(r.trainable, dtype=torch.float32)
        with torch.no_grad():
            lp, _ = completion_logprobs(model, ids_, torch.ones_like(ids_), target, 1.0)
        fresh = lp[0, P - 1 : P - 1 + len(r.completion_ids)][mask]
        assert torch.allclose(fresh, torch.tensor(r.sample_logprobs)[mask], atol=1e-4)
    assert any(r.info["turns"] > 1 for r in rollouts)


@pytest.mark.parametrize("objective", ["ppo_clip", "gspo", "gspo_token", "cispo"])
def test_loss_ignores_whatever_sits_at_environment_positions(objective: str) -> None:
    """Every objective, with the KL and entropy terms on: values at mask-0 (environment) positions change neither
    the loss nor the gradient anywhere, and receive no gradient."""
    from keelrl.algo.config import AlgoConfig
    from keelrl.algo.losses import token_weights
    from keelrl.algo.objectives import LossInputs, compute_loss

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1, 1]], dtype=torch.float32)  # [2, 7]
    algo = AlgoConfig(objective=objective, kl_coef=0.1, entropy_coef=0.01)
    base = {k: torch.randn(2, 7, generator=g) * 0.3 - 1.0 for k in ("lp", "old", "ref", "ent")}

    def run(noise: float) -> tuple[float, torch.Tensor]:
        env = (1 - mask) * noise  # change only what sits at environment positions
        lp = (base["lp"] + env).requires_grad_()
        inputs = LossInputs(
            logprobs=lp, entropy=base["ent"].abs() + env.abs(), old_logprobs=base["old"] - env,
            advantages=torch.tensor([1.0, -0.5]), mask=mask, loss_weights=token_weights(mask, "token_mean", 10.0, 2.0, 8),
            metric_weights=mask / 10.0, ref_logprobs=base["ref"] + 2 * env,
        )  # fmt: skip
        loss, _ = compute_loss(inputs, algo)
        loss.backward()
        return float(loss.detach()), lp.grad

    loss0, grad0 = run(0.0)
    loss1, grad1 = run(5.0)
    assert loss1 == pytest.approx(loss0, abs=1e-6) and torch.allclose(grad0, grad1, atol=1e-7)
    assert (grad1 * (1 - mask)).abs().sum() == 0 and (grad1 * mask).abs().sum() > 0


def test_environment_tokens_are_never_trained_on(tok) -> None:
    """The whole update path (collate, the policy's forward, every loss term): replacing the environment's
    trailing tokens by others of the same length leaves the gradient bit-identical; marking them trainable,
    or changing a mid-episode reply (context for the turns after it), does not."""
    from keelrl.algo.config import AlgoConfig
    from keelrl.rollout import Rollout
    from keelrl.run.distributed import World
    from keelrl.step.batch import collate
    from keelrl.step.update import minibatch_backward

    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, max_positions=128),
        len(tok),
        tok.eos_token_id,
    )
    h, o, eos = tok.convert_tokens_to_ids("h"), tok.convert_tokens_to_ids("o"), tok.eos_token_id
    prompt, m1, m2 = ids(tok, "U", ":", "h"), [h, o, eos], [o, h, h, eos]

    def rollout(e1: list[int], e2: list[int], train_env: bool = False) -> Rollout:
        completion = m1 + e1 + m2 + e2
        trainable = [1] * 3 + [int(train_env)] * len(e1) + [1] * 4 + [int(train_env)] * len(e2)
        return Rollout(
            problem_index=0, problem={}, group=0, prompt_ids=prompt, completion_ids=completion,
            sample_logprobs=[-1.0] * len(completion), trainable=trainable, finish_reason="context",
            policy_version=0, sampling=SamplingSettings(8), advantage=0.7,
        )  # fmt: skip

    algo = AlgoConfig(kl_coef=0.1, entropy_coef=0.01)

    def grads(r: Rollout) -> torch.Tensor:
        batch = collate([r, rollout(ids(tok, "T"), [])], tok.pad_token_id, torch.device("cpu"))
        batch.ref_logprobs = batch.sampler_logprobs - 0.1
        batch.old_logprobs = batch.sampler_logprobs
        model.zero_grad()
        minibatch_backward(model, batch, torch.arange(2), algo, 1, 1.0, 8, World())
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    e1, e2 = ids(tok, "T", ":", "o"), ids(tok, "\n", "T", "o", "o", "l")
    other_e2 = ids(tok, "x", "y", "z", "w", "q")
    reference = grads(rollout(e1, e2))
    assert torch.equal(grads(rollout(e1, other_e2)), reference)
    assert not torch.allclose(grads(rollout(e1, other_e2, train_env=True)), reference)
    assert not torch.allclose(grads(rollout(ids(tok, "x", "y", "z"), e2)), reference)
