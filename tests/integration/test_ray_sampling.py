"""distributed.sampler = "ray": the actor pool generates exactly what the training process would, follows
the weights it is sent, a killed actor loses and repeats nothing, and a training run ends with the same
weights with either sampler."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from keelrl.config import ModelConfig, TinyModelConfig, load_config
from keelrl.loop.trainer import train
from keelrl.models.load import load_policy
from keelrl.models.weights import untied_state_dict
from keelrl.rollout import Generation, SamplingSettings
from keelrl.rollout.hf import HFSampler, generation_chunks
from keelrl.rollout.ray import SamplerPool, SamplingWorker, group_chunks

ray = pytest.importorskip("ray")
# the dying worker below travels to the actors by value (the actors cannot import this test module)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODEL = ModelConfig(
    path="tiny",
    tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, max_positions=64, init_seed=5),
)
SETTINGS = SamplingSettings(max_new_tokens=16, temperature=1.0, top_p=0.95)


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_with_ray_sampler_matches_local(format_run: list[str], tmp_path: Path) -> None:
    """Runs first, before the module's Ray exists: the run's pools (sampler and scorer) start one Ray for
    both and stop it at the end. rollout.chunk_size > 0, so every batch is the in-process sampler's and the
    sampler log-probs (the old-policy log-probs of the update) are bit-identical."""
    started_ray = not ray.is_initialized()
    common = [
        *format_run,
        "rollout.chunk_size=8",
        "train.steps=2",
        "eval.at_start=false",
        "eval.every_steps=0",
        "supervisor.enabled=false",
    ]
    runs = {}
    ray_pools = ['distributed.sampler="ray"', 'distributed.scorer="ray"']
    for name, pools in {"local": [], "ray": ray_pools}.items():
        summary = train(load_config("configs/smoke.toml", [*common, *pools]), tmp_path / name)
        runs[name] = (summary["weights_sha256"], _metrics(tmp_path / name))
    if started_ray:
        assert not ray.is_initialized()  # the last pool to shut down stopped the Ray they shared
    (local_sha, local_metrics), (ray_sha, ray_metrics) = runs["local"], runs["ray"]
    assert [m["step"] for m in ray_metrics] == [1, 2]
    for key in ("sampler/replaced_workers", "scorer/replaced_workers"):  # the Ray paths really ran
        assert all(m[key] == 0.0 for m in ray_metrics) and not any(key in m for m in local_metrics)
    # rewards vary, so the updates depend on the samples
    assert any(m["reward/std"] > 0 for m in local_metrics)
    keys = ["reward/mean", "reward/std", "response_length/mean", "entropy", "loss/total"]
    assert [[m[k] for k in keys] for m in ray_metrics] == [[m[k] for k in keys] for m in local_metrics]
    assert ray_sha == local_sha


@pytest.mark.slow  # 40 s: a sampling process, then a Ray actor pool
def test_asynchronous_training_on_ray_actors_matches_the_sampling_process(
    format_run: list[str], tmp_path: Path
) -> None:
    """rollout.max_staleness = 1: the pipeline's sampler is the Ray pool instead of a child process; with
    rollout.chunk_size > 0 both generate bit-identically, so the runs end with the same weights."""
    common = [
        *format_run, "rollout.chunk_size=8", "rollout.max_staleness=1", "train.steps=3", "eval.at_start=false",
        "eval.every_steps=0", "supervisor.enabled=false",
    ]  # fmt: skip
    shas = {}
    for name, pools in {"process": [], "ray": ['distributed.sampler="ray"']}.items():
        shas[name] = train(load_config("configs/smoke.toml", [*common, *pools]), tmp_path / name)[
            "weights_sha256"
        ]
        assert [m["async/staleness_max"] for m in _metrics(tmp_path / name)] == [0.0, 1.0, 1.0]
    assert "sampler/replaced_workers" in _metrics(tmp_path / "ray")[-1]
    assert shas["ray"] == shas["process"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def prompts_and_seeds(
    first_seed: int, groups: int = 8, group_size: int = 4
) -> tuple[list[list[int]], list[int]]:
    """Groups of identical prompts of different lengths, laid out as the trainer does (group by group)."""
    _, tok = load_policy(MODEL)
    prompts, seeds = [], []
    for g in range(groups):
        ids = tok(f"{g * 7 % 10}*{(g + 3) * 11 % 97}" + "+1" * (g % 3) + "\n<answer>")["input_ids"]
        prompts += [ids] * group_size
        seeds += [first_seed + g * group_size + k for k in range(group_size)]
    return prompts, seeds


def one_batch_per_actor(prompts: list[list[int]]) -> list[list[int]]:
    """The pool's batches with chunk_size 0 and 2 actors."""
    return group_chunks(prompts, generation_chunks(prompts, 0)[0], 2)


KILL_SEED = 10_000  # the kill test's seeds start here; no other test uses them


class DyingSamplingWorker(SamplingWorker):
    """Kills its own process (like an out-of-memory kill) on a chunk holding the row seeded `die_seed`,
    while the file `deaths` holds fewer than `times` lines."""

    deaths, times, die_seed = "", 0, -1

    def generate(
        self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int], version: int
    ) -> list[Generation]:
        path = Path(self.deaths)
        if (
            self.die_seed in seeds
            and (len(path.read_text().splitlines()) if path.exists() else 0) < self.times
        ):
            with open(path, "a") as f:
                f.write(f"{os.getpid()}\n")
            os._exit(1)
        return super().generate(prompts, settings, seeds, version)


@pytest.fixture(scope="module")
def deaths(local_ray, tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sampler_deaths") / "deaths"


@pytest.fixture(scope="module")
def pool(local_ray, deaths: Path):
    """One pool for the module (actors take seconds to import torch): its actors die once, on the second
    batch of the kill test (chunk_size 0, 2 actors)."""
    prompts, seeds = prompts_and_seeds(KILL_SEED)
    attrs = {"deaths": str(deaths), "times": 1, "die_seed": seeds[one_batch_per_actor(prompts)[1][0]]}
    pool = SamplerPool(MODEL, workers=2, max_retries=2, worker=type("Dying", (DyingSamplingWorker,), attrs))
    yield pool
    pool.shutdown()


class ReportingSamplingWorker(SamplingWorker):
    def decoder_is_compiled(self) -> bool:
        return self.sampler.model.get_decoder()._compiled_call_impl is not None


@pytest.mark.parametrize("compile", [False, True])
def test_actors_compile_their_decoder_with_train_compile(local_ray, compile: bool) -> None:
    """train.compile reaches the actors (compilation itself runs on their first batch)."""
    pool = SamplerPool(MODEL, workers=1, compile=compile, worker=ReportingSamplingWorker)
    try:
        assert pool.actors.run("decoder_is_compiled", [()], ["check"]) == [compile]
    finally:
        pool.shutdown()


def perturbed(model: torch.nn.Module, seed: int) -> None:
    """Move every weight a little (tied ones together), as an optimizer step would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_pool_generates_like_the_training_process_and_follows_the_weights(pool: SamplerPool) -> None:
    policy, tok = load_policy(MODEL)
    local = HFSampler(policy, tok, chunk_size=8)
    prompts, seeds = prompts_and_seeds(0)
    pool.chunk_size = 8  # the in-process sampler's batches: results are bit-identical
    pool.update_weights(untied_state_dict(policy).items(), 0)
    expected = local.generate(prompts, SETTINGS, seeds)
    assert pool.generate(prompts, SETTINGS, seeds) == expected  # token for token, log-prob for log-prob
    assert pool.policy_version == 0
    assert len({tuple(g.completion_ids) for g in expected}) > len(expected) // 2  # the samples differ

    perturbed(policy, 1)  # version 1: new weights reach every actor
    pool.update_weights(untied_state_dict(policy).items(), 1)
    expected_v1 = local.generate(prompts, SETTINGS, seeds)
    assert expected_v1 != expected
    assert pool.generate(prompts, SETTINGS, seeds) == expected_v1 and pool.policy_version == 1

    perturbed(policy, 2)  # the same version is not sent again: a version names one set of weights
    pool.update_weights(untied_state_dict(policy).items(), 1)
    assert pool.generate(prompts, SETTINGS, seeds) == expected_v1
    pool.update_weights(untied_state_dict(policy).items(), 2)
    assert pool.generate(prompts, SETTINGS, seeds) == local.generate(prompts, SETTINGS, seeds)
    assert pool.policy_version == 2


def test_killed_actor_loses_and_repeats_nothing(pool: SamplerPool, deaths: Path) -> None:
    """chunk_size 0: one batch per actor, cut at group boundaries. The actor of the second batch dies while
    the first is being generated; its replacement loads the latest weights (version 7, not the ones it
    builds) and redoes the batch from the same seeds."""
    policy, tok = load_policy(MODEL)
    perturbed(policy, 7)
    prompts, seeds = prompts_and_seeds(KILL_SEED)
    chunks = one_batch_per_actor(prompts)
    assert len(chunks) == 2 and all(len(rows) % 4 == 0 for rows in chunks)  # whole groups
    # A row's floats depend on the batch it is in, so the exact reference is the in-process sampler run on
    # the pool's two batches; against one batch of all rows, the tokens are equal and the log-probs close.
    local = HFSampler(policy, tok)
    expected: list[Generation | None] = [None] * len(prompts)
    for rows in chunks:
        for i, gen in zip(
            rows, local.generate([prompts[i] for i in rows], SETTINGS, [seeds[i] for i in rows])
        ):
            expected[i] = gen
    one_batch = local.generate(prompts, SETTINGS, seeds)
    assert [g.completion_ids for g in expected] == [g.completion_ids for g in one_batch]
    for a, b in zip(expected, one_batch):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)

    pool.chunk_size = 0
    pool.update_weights(untied_state_dict(policy).items(), 7)
    replaced = pool.actors.replaced_total
    got = pool.generate(prompts, SETTINGS, seeds)
    assert len(deaths.read_text().splitlines()) == 1  # an actor really died
    assert (
        pool.actors.replaced_total == replaced + 1
        and pool.actors.take_replaced() == 1
        and pool.actors.take_replaced() == 0
    )
    assert got == expected  # every row once, from the weights of version 7
    assert pool.generate(prompts, SETTINGS, seeds) == expected  # the replacement serves the next call
    assert pool.actors.replaced_total == replaced + 1
