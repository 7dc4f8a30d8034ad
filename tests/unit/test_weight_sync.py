"""weight_sync.sync_sampler without vLLM: an engine stand-in holds its own copy of the policy (as the vLLM
engine does) and is checked after every push. A skipped push is caught and fixed by the second push; an
engine that never takes new weights stops the step with WeightSyncError; an in-process sampler is not probed."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from keelrl.config import TinyModelConfig, load_config
from keelrl.models.load import build_char_tokenizer, build_tiny_model
from keelrl.monitor.run_dir import RunDir
from keelrl.rollout import SamplingSettings
from keelrl.rollout.episodes import Prompter
from keelrl.rollout.hf import HFSampler
from keelrl.run.faults import FaultInjector
from keelrl.step.weight_sync import WeightSyncError, sync_sampler
from keelrl.tasks import get_task


class CopyEngine(HFSampler):
    """Samples its own copy of the weights; `frozen` ignores every push (a broken transfer)."""

    checks_sync = True

    def __init__(self, model: torch.nn.Module, tokenizer: Any, frozen: bool = False) -> None:
        super().__init__(copy.deepcopy(model), tokenizer)
        self.frozen = frozen

    def update_weights(self, weights, version, reset_prefix_cache=True) -> None:
        if not self.frozen:
            super().update_weights(weights, version)

    def generate_on_each(self, prompts, settings, seeds):
        return [self.generate(prompts, settings, seeds)]


class TwoEngines:
    """A pool of two copy engines (as a Ray pool of vLLM actors): `generate` uses the first only, the probe
    asks both."""

    checks_sync = True

    def __init__(self, first: CopyEngine, second: CopyEngine) -> None:
        self.engines = [first, second]

    @property
    def policy_version(self) -> int:
        return self.engines[0].policy_version

    def generate(self, prompts, settings, seeds):
        return self.engines[0].generate(prompts, settings, seeds)

    def update_weights(self, weights, version, reset_prefix_cache=True) -> None:
        weights = list(weights)
        for e in self.engines:
            e.update_weights(weights, version)

    def generate_on_each(self, prompts, settings, seeds):
        return [e.generate(prompts, settings, seeds) for e in self.engines]


def make_run(tmp_path: Path, engine_frozen: bool, *overrides: str) -> tuple[Any, Any, list[dict[str, Any]]]:
    tok = build_char_tokenizer()
    policy = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_heads=4, max_positions=128), len(tok), 0
    ).eval()
    cfg = load_config(None, ['rollout.engine="vllm"', "vllm.block_size=32", *overrides])
    task = get_task("multiply", digits_a=1, digits_b=1)
    events: list[dict[str, Any]] = []
    run = SimpleNamespace(
        cfg=cfg,
        sampler=CopyEngine(policy, tok, engine_frozen),
        sampler_model=policy,
        faults=FaultInjector(cfg.faults, RunDir(tmp_path / "run")),
        prompter=Prompter(task, tok, "compact"),
        tokenizer=tok,
        task=task,
        settings=SamplingSettings(8, 1.0),
        event=lambda kind, step, **fields: events.append({"kind": kind, "step": step, **fields}),
        whole_policy=lambda state: policy,
    )
    state = SimpleNamespace(policy=policy, policy_version=0)
    return run, state, events


def move(policy: torch.nn.Module) -> None:
    """An update large enough to move log-probs well past the fp32 tolerance."""
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)


def test_a_good_push_passes_and_a_skipped_push_is_caught_and_redone(tmp_path: Path) -> None:
    run, state, events = make_run(tmp_path, False, "faults.skip_weight_sync_at_step=2")
    first = sync_sampler(run, state, 1)
    assert first["sync/gap_max"] < 1e-4 and first["sync/retries"] == 0 and not events
    move(state.policy)
    state.policy_version = 1
    caught = sync_sampler(run, state, 2)  # the drill skips the first push
    assert [e["kind"] for e in events] == ["weight_sync_failed", "weight_sync_recovered"]
    assert events[0]["gap_mean"] > events[0]["tolerance"] == 1e-3
    assert caught["sync/retries"] == 1 and caught["sync/gap_max"] < 1e-4
    assert run.sampler.policy_version == 1


def test_an_engine_that_never_takes_the_weights_stops_the_step(tmp_path: Path) -> None:
    run, state, events = make_run(tmp_path, True)
    move(state.policy)
    with pytest.raises(WeightSyncError, match="weight sync failed twice at step 3"):
        sync_sampler(run, state, 3)
    assert [e["kind"] for e in events] == ["weight_sync_failed"]


def test_the_check_can_be_turned_off_and_an_in_process_sampler_is_not_probed(tmp_path: Path) -> None:
    run, state, events = make_run(tmp_path, True, "vllm.sync_check_prompts=0")
    move(state.policy)
    assert set(sync_sampler(run, state, 1)) == {"time/sync_s"} and not events
    run.sampler = HFSampler(state.policy, run.tokenizer)  # owns the weights: nothing to check
    assert set(sync_sampler(run, state, 1)) == {"time/sync_s"}


def test_one_stale_engine_of_a_pool_fails_the_check(tmp_path: Path) -> None:
    """The probe asks every engine: the first engine alone (the one `generate` used) would have passed."""
    run, state, events = make_run(tmp_path, False)
    good = run.sampler
    run.sampler = TwoEngines(good, CopyEngine(state.policy, run.tokenizer, frozen=True))
    assert sync_sampler(run, state, 1)["sync/gap_max"] < 1e-4  # both copies start from the same weights
    move(state.policy)
    with pytest.raises(WeightSyncError, match="weight sync failed twice at step 2"):
        sync_sampler(run, state, 2)
    assert [e["kind"] for e in events] == ["weight_sync_failed"] and events[0]["gap_mean"] > 1e-3
    run.sampler = TwoEngines(good, CopyEngine(state.policy, run.tokenizer))  # two engines that follow
    assert sync_sampler(run, state, 3)["sync/gap_max"] < 1e-4


@pytest.mark.parametrize(
    "gaps, retried, fails", [((2.0, 0.5), True, False), ((2.0, 2.0), True, True), ((0.5,), False, False)]
)
def test_the_tolerance_is_the_boundary_and_the_retry_resets_the_prefix_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gaps: tuple[float, ...], retried: bool, fails: bool
) -> None:
    """The check's decisions on gaps given as multiples of vllm.tolerance (1e-3): a mean gap of 2x the tolerance
    fails the check, 0.5x passes; after a failure the weights are pushed again with the prefix cache reset (the
    engine's cached keys may hold the old weights), and a second failure stops the step."""
    from keelrl.rollout.sync_check import SyncGap
    from keelrl.step import weight_sync

    run, state, events = make_run(tmp_path, False)
    pushes: list[bool] = []
    load = run.sampler.update_weights
    run.sampler.update_weights = lambda w, v, reset_prefix_cache=True: (
        pushes.append(reset_prefix_cache),
        load(w, v),
    )
    queue = [SyncGap(max=3 * g * 1e-3, mean=g * 1e-3, tokens=10) for g in gaps]
    monkeypatch.setattr(weight_sync, "probe", lambda run, state: queue.pop(0))
    if fails:
        with pytest.raises(WeightSyncError, match="failed twice"):
            sync_sampler(run, state, 1)
    else:
        out = sync_sampler(run, state, 1)
        assert out["sync/retries"] == float(retried) and out["sync/gap_mean"] == pytest.approx(
            gaps[-1] * 1e-3
        )
    assert pushes == [True, True] if retried else pushes == [True]
    assert [e["kind"] for e in events][:1] == (["weight_sync_failed"] if retried else [])
    assert not queue  # every gap was probed
