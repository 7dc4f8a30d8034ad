"""The weight-sync check's arithmetic (rollout/sync_check.py), the engine config checks, and the drills'
switches: worked numbers that fail if a term, a normaliser or a sign changes."""

from __future__ import annotations

import math

import pytest
import torch

from keelrl.config import ConfigError, TinyModelConfig, load_config
from keelrl.config.root import check_engine
from keelrl.config.vllm import SYNC_TOLERANCE
from keelrl.models.load import build_char_tokenizer, build_tiny_model
from keelrl.rollout import sampler_kind
from keelrl.rollout.ray import ray_cpus
from keelrl.rollout.sync_check import logprob_gap, trainer_logprobs
from keelrl.run.faults import FaultInjector


def test_logprob_gap_worked_numbers() -> None:
    gap = logprob_gap([[-1.0, -2.0], [-0.5]], [[-1.1, -2.0], [-0.2]])
    assert gap.tokens == 3
    assert gap.max == pytest.approx(0.3)
    assert gap.mean == pytest.approx(0.4 / 3)  # a token mean, not a mean of row means (0.1 + 0.05) / 2
    # the gap is symmetric and never negative: an engine above or below the trainer is off alike
    assert logprob_gap([[-1.1, -2.0], [-0.2]], [[-1.0, -2.0], [-0.5]]) == gap
    assert logprob_gap([], []).tokens == 0


def test_logprob_gap_refuses_rows_that_do_not_line_up() -> None:
    with pytest.raises(ValueError):
        logprob_gap([[-1.0, -2.0]], [[-1.0]])
    with pytest.raises(ValueError):
        logprob_gap([[-1.0]], [[-1.0], [-2.0]])


def test_trainer_logprobs_are_tempered_log_softmax() -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_heads=4, max_positions=64), len(tok), 0
    ).eval()
    prompt, completion = tok.encode("ab"), tok.encode("cde")
    # a longer row and a row with nothing sampled beside it: right padding must change nothing
    prompts, completions = [prompt, tok.encode("xyzw"), prompt], [completion, tok.encode("vutsrq"), []]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    for temperature in (1.0, 0.7):
        got = trainer_logprobs(model, prompts, completions, temperature)
        assert [len(g) for g in got] == [3, 6, 0]
        for k, token in enumerate(completion):  # position len(prompt) - 1 + k predicts completion[k]
            row = torch.log_softmax(logits[len(prompt) - 1 + k] / temperature, dim=-1)
            assert got[0][k] == pytest.approx(float(row[token]), abs=1e-5)
    # temperature 0 (greedy) is scored at temperature 1, as both samplers report it
    greedy = trainer_logprobs(model, prompts, completions, 0.0)
    assert greedy == trainer_logprobs(model, prompts, completions, 1.0)
    assert not math.isclose(greedy[0][0], trainer_logprobs(model, prompts, completions, 0.7)[0][0])


def test_engine_config_checks() -> None:
    cfg = load_config(None, ['rollout.engine="vllm"'])
    assert sampler_kind(cfg) == "vllm" and sampler_kind(load_config(None, [])) == "hf"
    assert cfg.vllm.tolerance == SYNC_TOLERANCE["float32"] == 1e-3
    assert load_config(None, ['rollout.engine="vllm"', "vllm.sync_tolerance=0.02"]).vllm.tolerance == 0.02
    for bad, words in (
        (["rollout.top_p=0.9"], "top_p = 1.0"),
        (["rollout.top_k=5"], "top_k = 0"),
        (['vllm.dtype="bfloat16"'], "algo.old_logprobs = 'recompute'"),
    ):
        with pytest.raises(ConfigError, match=r"rollout\.engine|vllm\.dtype") as err:
            load_config(None, ['rollout.engine="vllm"', *bad])
        assert words in str(err.value)
    ok = load_config(
        None, ['rollout.engine="vllm"', 'vllm.dtype="bfloat16"', 'algo.old_logprobs="recompute"']
    )
    assert ok.vllm.tolerance == SYNC_TOLERANCE["bfloat16"]
    check_engine(load_config(None, ["rollout.top_p=0.9"]))  # the hf sampler handles top-p itself
    pooled = load_config(None, ['rollout.engine="vllm"', 'distributed.sampler="ray"', "vllm.threads=3"])
    assert sampler_kind(pooled) == "ray" and ray_cpus(pooled) == 2 * 3  # vLLM actors reserve the engine's
    assert ray_cpus(load_config(None, ['distributed.sampler="ray"', 'distributed.scorer="ray"'])) == 2 + 2


def test_weight_sync_drills_fire_once_and_only_when_set(tmp_path) -> None:
    from keelrl.monitor.run_dir import RunDir

    off = FaultInjector(load_config(None, []).faults, RunDir(tmp_path / "off"))
    assert [off.weight_sync_drill(s) for s in range(4)] == [None] * 4  # 0 means off, also at step 0
    cfg = load_config(
        None, ["faults.skip_weight_sync_at_step=2", "faults.stale_prefix_cache_at_step=3"]
    ).faults
    on = FaultInjector(cfg, RunDir(tmp_path / "on"))
    assert [on.weight_sync_drill(s) for s in range(5)] == [None, None, "skip", "stale_prefix_cache", None]
    assert on.weight_sync_drill(2) is None  # fired once; a restarted worker reads the events and agrees
    again = FaultInjector(cfg, RunDir(tmp_path / "on"))
    assert again.weight_sync_drill(2) is None and again.weight_sync_drill(3) is None
