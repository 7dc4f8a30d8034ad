"""Curriculum vs uniform vs fixed-hard: the same base model, the same RL budget, several seeds. Prints JSON.

    python benchmarks/curriculum.py [--family FAMILY] [--base-model DIR] [--seeds 3] [--steps 100] [--eval-every 10]
                                    [--hard-gain 0.05] [--jobs 3] [--quick] [--out FILE]

Families (benchmarks/curriculum_families.py; buckets easiest first, the last is the hardest; a ~1M-parameter
character model, compact template, answers only but for one scratchpad, so every arm runs on a CPU):
- countdown: `keelrl demo`'s Countdown (numbers 1..50, targets up to 2500) in buckets n2, n3, n4 (how many
  numbers). Base: keelrl.recipes.demo's corpus (`corpus_text`: the format, answers not solutions).
- multiply: products in buckets 1x1, 2x1, 3x1 (digits of each factor). Base: 800 steps on correct products of
  every rung (`multiply_corpus`), which leaves it imperfect everywhere and near zero on 3x1.
- countdown_set: the demo's two-number Countdown, 1 to 4 problems per prompt, paid only when all are solved
  (tasks/countdown_set.py), buckets x1-x4: one skill, a set of k solved with about the k-th power of one
  problem's rate. Base: keelrl.recipes.demo's corpus per problem (`countdown_set_corpus`): about chance per problem.
  countdown_set_restated: the same task, the base taught to restate each problem's line with its equation before
  the answer block (a scratchpad; 128 new tokens, a 256-position model).
- cipher: words of 1 to 4 letters encoded with a secret substitution key the model is never shown
  (tasks/cipher.py), buckets len1-len4, all-or-nothing: 26 small facts that compose, learnt from reward alone.
  Base: every letter replaced by one of five candidates, the key's image among them (`cipher_corpus`): the
  format and where each substitute goes, about 1/5 per letter; pretrained in two stages (2000 steps at lr 3e-3,
  2000 at 1e-3).
- spell_backward: reasoning-gym's spell_backward, levels L0-L2 (words of 3, 5, 7 letters; the hardest alone by
  the adapter's min_level). Base: questions with their reference answers (`question_answer_corpus`); 420 steps
  leave greedy 0.65 / 0.19 / 0.005 (docs/curriculum.md).
RL settings are the demo's (16 prompts x 8, lr 3e-4, GRPO, clip 0.2/0.28).

Base model: `--base-model DIR` (an HF directory); without it, a base is pretrained once with keelrl.recipes.demo's
`pretrain` on the family's corpus over every bucket and cached in WORK/base_<family> (the JSON says which).
Every arm and seed starts from that same base.

Arms (identical RL settings; only which problems are drawn differs):
- curriculum: `curriculum.kind = "adaptive"`, strategy learnability p(1-p) over the buckets (defaults:
  decay 0.9, revisit 0.1).
- uniform: the same machinery with `strategy = "uniform"`: each bucket an equal share of the prompts.
- fixed_hard: the hardest bucket only.
- curriculum_dynamic (only with `--dynamic`): curriculum plus DAPO dynamic sampling; it generates more
  samples per step (reported), so it is not part of the equal-budget comparison.

Each run trains in legs of `--eval-every` steps (train() resumed with more steps, which is exact: see
tests/integration/test_curriculum_run.py), and after each leg the policy is evaluated greedily on the same
`--eval-problems` held-out problems of every bucket. The issue's measure is `steps_to_hardest_bucket_target`:
the first evaluated step at which the hardest bucket's accuracy reaches `--hard-target` (default: the base's +
`--hard-gain`), with the samples generated until then (`samples_to_hard_target`); `steps_to_target` is the same
for the mean over buckets and `--target`. A seed that never gets there counts as `--steps` in the mean (a lower
bound; `censored` says how many); intervals are percentile bootstraps over seeds. `no_signal_per_bucket` is each
arm's share of groups without reward variance per bucket: whether the hardest bucket gives signal at all. The
bar: the curriculum needs at most 2/3 of uniform's steps to the hardest bucket's target (`target_met`).
`--jobs` runs train in parallel processes (`--threads` torch threads each).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from curriculum_families import FAMILIES, buckets_of  # benchmarks/: the task families
from keelrl.config import ModelConfig, TinyModelConfig, config_from_dict
from keelrl.evals import run_eval, summarize
from keelrl.evals.stats import bootstrap_means, percentile_interval
from keelrl.loop.trainer import train
from keelrl.models.load import build_char_tokenizer, build_tiny_model, load_policy, save_hf_dir
from keelrl.recipes.demo import pretrain
from keelrl.rollout import SamplingSettings
from keelrl.rollout.hf import HFSampler
from keelrl.tasks import Prompt, Score, Task, get_task

BASE_MODEL = TinyModelConfig(hidden_size=128, num_layers=4, num_heads=4, max_positions=128)


def base_model_config(family: str) -> TinyModelConfig:
    """BASE_MODEL with the family's context length."""
    return BASE_MODEL.model_copy(update={"max_positions": FAMILIES[family].max_positions})


# arms: which of the family's params ("all" buckets or the "hardest" alone) and the [curriculum] section
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "curriculum": ("all", {"kind": "adaptive", "strategy": "learnability"}),
    "uniform": ("all", {"kind": "adaptive", "strategy": "uniform"}),
    "fixed_hard": ("hardest", {"kind": "adaptive", "strategy": "uniform"}),
    "curriculum_dynamic": (
        "all",
        {"kind": "adaptive", "strategy": "learnability", "dynamic_sampling": True, "refill_budget": 1.0},
    ),
}


class BucketView:
    """One difficulty bucket of a task, as a Task (for run_eval): problem(split, i) = problem_in(bucket, ...)."""

    def __init__(self, task: Any, bucket: str) -> None:
        self.task, self.bucket, self.name = task, bucket, f"{task.name}/{bucket}"

    def problem(self, split: str, index: int) -> dict[str, Any]:
        return self.task.problem_in(self.bucket, split, index)  # type: ignore[arg-type]

    def prompt(self, problem: dict[str, Any], template: str) -> Prompt:
        return self.task.prompt(problem, template)  # type: ignore[arg-type]

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        return self.task.score(problem, completion)

    def difficulty(self, problem: dict[str, Any]) -> str:
        return self.bucket


STAGE_LINES = 10_000_000  # corpus lines per pretraining stage: stage k reads lines k*STAGE_LINES onwards


def pretrain_base(
    family: str, out: Path, stages: tuple[tuple[int, float], ...], batch_size: int, seed: int
) -> dict[str, Any]:
    """Pretrain the benchmark's base model on the family's corpus over every bucket, in `stages` of (steps,
    peak lr) with a fresh schedule each (stage k: pretraining seed + k, new corpus lines); save an HF dir."""
    fam = FAMILIES[family]
    task = get_task(fam.task, **fam.params)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        base_model_config(family).model_copy(update={"init_seed": seed}),
        len(tokenizer),
        tokenizer.eos_token_id,
    )
    results = []
    for k, (steps, lr) in enumerate(stages):
        lines = lambda i, k=k: fam.corpus(task, i + k * STAGE_LINES, seed)  # noqa: E731
        results.append(pretrain(model, tokenizer, lines, steps, batch_size, lr, seed + k))
    save_hf_dir(model, tokenizer, out)
    info = {
        "pretrained_by": f"benchmarks/curriculum.py: keelrl.recipes.demo.pretrain on {fam.corpus.__name__}, every bucket",
        "family": family,
        "steps": sum(steps for steps, _ in stages),
        "stages": [list(stage) for stage in stages],
        "batch_size": batch_size,
        "seed": seed,
        "tokens": sum(r.tokens for r in results),
        "final_loss": results[-1].final_loss,
        "seconds": sum(r.seconds for r in results),
        "task_params": fam.params,
        "model": base_model_config(family).model_dump(),
    }
    (out / "pretrain.json").write_text(json.dumps(info, indent=2))
    return info


def cached_base_matches(family: str, base: Path, stages: tuple[tuple[int, float], ...]) -> bool:
    """Whether `base` holds a base pretrained by this script with today's task, model and stages (a cache
    from an older version of the benchmark, e.g. another number range, is pretrained again)."""
    try:
        info = json.loads((base / "pretrain.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return (
        info.get("task_params") == FAMILIES[family].params
        and info.get("family", "countdown") == family
        and info.get("model") == base_model_config(family).model_dump()
        and info.get("stages", [[info.get("steps"), info.get("lr")]]) == [list(stage) for stage in stages]
    )


def evaluate_buckets(
    model_dir: Path, family: str, problems: dict[str, int], max_new_tokens: int
) -> dict[str, float]:
    """Greedy accuracy on the first `problems[b]` held-out problems of each bucket b."""
    policy, tokenizer = load_policy(ModelConfig(path=str(model_dir)))
    sampler = HFSampler(policy, tokenizer)
    fam = FAMILIES[family]
    task = get_task(fam.task, **fam.params)
    out = {}
    for bucket, n in problems.items():
        view: Task = BucketView(task, bucket)  # type: ignore[arg-type, assignment]
        results = run_eval(
            sampler=sampler,
            tokenizer=tokenizer,
            task=view,
            template="compact",
            num_problems=n,
            settings=SamplingSettings(max_new_tokens, temperature=0.0),
            batch_size=256,
        )
        out[bucket] = summarize(results)["accuracy"]
    return out


def rl_config(arm: str, base: Path, steps: int, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    which, curriculum = ARMS[arm]
    fam = FAMILIES[a.family]
    params = fam.params if which == "all" else fam.hard_params
    return {
        "model": {"path": str(base)},
        "task": {"name": fam.task, "template": "compact", "params": params, "seed": 0},
        "rollout": {
            "batch_size": a.prompts * 8,
            "group_size": 8,
            "max_new_tokens": a.max_new_tokens,
            "temperature": a.temperature,
        },
        "algo": {
            "lr": a.lr,
            "advantage": "grpo",
            "loss_agg": "token_mean",
            "clip_low": 0.2,
            "clip_high": 0.28,
        },
        "train": {
            "steps": steps,
            "micro_batch_size": min(32, a.prompts * 8),
            "seed": seed,
            "threads": a.threads,
        },
        "eval": {"every_steps": 0, "problems": 1, "at_start": False},
        "checkpoint": {"every_steps": 0, "keep_last": 1, "keep_best": 0},
        "log": {"rollouts_per_step": 4, "tensorboard": False, "progress": False, "console_every": 10},
        "supervisor": {"enabled": False},
        "curriculum": curriculum,
    }


def run_arm(
    arm: str, seed: int, base: Path, work: Path, a: argparse.Namespace, problems: dict[str, int]
) -> dict[str, Any]:
    """Train one arm for a.steps in legs of a.eval_every, evaluating after each leg."""
    torch.set_num_threads(a.threads)
    run_dir = work / f"{arm}_s{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a leftover run would be resumed, not retrained
    curve: list[dict[str, Any]] = []
    t0 = time.time()
    for end in range(a.eval_every, a.steps + 1, a.eval_every):
        cfg = config_from_dict(rl_config(arm, base, end, seed, a), f"benchmark {arm}")
        train(cfg, run_dir, resume="auto")
        acc = evaluate_buckets(run_dir / "final", a.family, problems, a.max_new_tokens)
        curve.append({"step": end, **acc, "mean": statistics.mean(acc.values())})
        print(
            f"  {arm} seed {seed} step {end}: "
            + " ".join(f"{b} {v:.3f}" for b, v in curve[-1].items() if b != "step"),
            file=sys.stderr,
        )
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_metrics = [m for m in metrics if "reward/mean" in m]
    last, hard = train_metrics[-1], list(problems)[-1]
    reached = next((p["step"] for p in curve if p[hard] >= a.hard_target), None)
    return {
        "curve": curve,
        "steps_to_target": next((p["step"] for p in curve if p["mean"] >= a.target), None),
        "steps_to_hard_target": reached,
        # compute to the hard target: samples generated up to that step (the same per step in the equal-budget arms)
        "samples_to_hard_target": None
        if reached is None
        else sum(m.get("curriculum/generated_samples", a.prompts * 8) for m in train_metrics[:reached]),
        "hardest_bucket_accuracy": curve[-1][hard],
        "final_accuracy": {b: curve[-1][b] for b in (*problems, "mean")},
        "generated_samples": sum(m.get("curriculum/generated_samples", a.prompts * 8) for m in train_metrics),
        "no_signal_frac": statistics.mean(
            m.get("curriculum/first_no_signal_frac", m["groups/no_signal_frac"]) for m in train_metrics
        ),
        "wall_seconds": time.time() - t0,
        "final_weights": {
            k.removeprefix("curriculum/weight/"): v
            for k, v in last.items()
            if k.startswith("curriculum/weight/")
        },
        "prompts_per_bucket": {
            b: sum(m.get(f"curriculum/prompts/{b}", 0.0) for m in train_metrics) for b in problems
        },
        # per bucket, the share of its groups whose rewards were all equal (steps that drew from it)
        "no_signal_per_bucket": {
            b: mean_or_none([m.get(f"curriculum/no_signal/{b}") for m in train_metrics]) for b in problems
        },
    }


def mean_or_none(values: list[float | None]) -> float | None:
    """The mean of the values that are there (None when none is)."""
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None


def censored_as_budget(per_seed: list[int | None], steps: int) -> list[int]:
    """Steps to a target per seed, a seed that never got there counted as the budget (a lower bound)."""
    return [steps if s is None else s for s in per_seed]


def steps_summary(per_seed: list[int | None], steps: int) -> dict[str, Any]:
    """Mean steps to a target over seeds (censored_as_budget). `ci95`: a percentile bootstrap over the seeds
    (with 3 seeds, a rough range rather than a precise interval)."""
    values = censored_as_budget(per_seed, steps)
    return {
        "mean": statistics.mean(values),
        "ci95": seed_interval(seed_means(values)),
        "per_seed": per_seed,
        "censored": sum(s is None for s in per_seed),
    }


def seed_means(values: list[int], seed: int = 0) -> np.ndarray:
    """Bootstrap means of per-seed values, seeds drawn with replacement (keelrl.evals.stats)."""
    return bootstrap_means(np.array([values], dtype=np.float64), seed=seed)[:, 0]


def seed_interval(draws: np.ndarray) -> list[float]:
    lo, hi = percentile_interval(draws)
    return [round(float(lo), 4), round(float(hi), 4)]


def summarize_arms(results: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "steps_to_target": {},
        "hardest_bucket_accuracy": {},
        "steps_to_hardest_bucket_target": {},
        "final_accuracy": {},
        "no_signal_frac": {},
        "generated_samples": {},
        "wall_seconds": {},
    }
    for arm, runs in results.items():
        out["steps_to_target"][arm] = steps_summary([r["steps_to_target"] for r in runs], steps)
        out["steps_to_hardest_bucket_target"][arm] = steps_summary(
            [r["steps_to_hard_target"] for r in runs], steps
        )
        accs = [r["hardest_bucket_accuracy"] for r in runs]
        out["hardest_bucket_accuracy"][arm] = {"mean": statistics.mean(accs), "per_seed": accs}
        out["final_accuracy"][arm] = {
            b: statistics.mean(r["final_accuracy"][b] for r in runs) for b in runs[0]["final_accuracy"]
        }
        out["no_signal_frac"][arm] = statistics.mean(r["no_signal_frac"] for r in runs)
        out.setdefault("no_signal_per_bucket", {})[arm] = {
            b: mean_or_none([r["no_signal_per_bucket"][b] for r in runs])
            for b in runs[0]["no_signal_per_bucket"]
        }
        out["generated_samples"][arm] = statistics.mean(r["generated_samples"] for r in runs)
        out["wall_seconds"][arm] = statistics.mean(r["wall_seconds"] for r in runs)
    return out


def verdict(summary: dict[str, Any], base: dict[str, float], a: argparse.Namespace, hard: str) -> str:
    """The result in words, from the numbers: whether the curriculum needed at most 2/3 of uniform's steps to
    the hardest bucket's target (the issue's 1.5x), and if not, why."""
    steps, final = summary["steps_to_hardest_bucket_target"], summary["final_accuracy"]
    reached = ", ".join(f"{arm} {a.seeds - s['censored']}/{a.seeds}" for arm, s in steps.items())
    parts = [f"Seeds reaching {hard} accuracy {a.hard_target}: {reached}."]
    if "curriculum" in steps and "uniform" in steps:
        cur, uni = steps["curriculum"], steps["uniform"]
        ratio = cur["mean"] / uni["mean"]
        met = ratio <= 2 / 3 and cur["censored"] == 0
        why = " (the curriculum did not reach the target in every seed)" if cur["censored"] else ""
        parts.append(
            f"Curriculum/uniform steps to it = {cur['mean']:.1f}/{uni['mean']:.1f} = {ratio:.2f} "
            f"(95% over seeds {summary['curriculum_over_uniform_ci95']}): the 2/3 bar is "
            + ("met." if met else f"not met{why}.")
        )
    change = {arm: {b: f[b] - base[b] for b in f} for arm, f in final.items()}
    parts.append(
        "Final minus base accuracy: "
        + "; ".join(f"{arm} " + " ".join(f"{b} {d:+.3f}" for b, d in c.items()) for arm, c in change.items())
        + "."
    )
    if max(c[hard] for c in change.values()) < 0.03:
        parts.append(
            f"No arm ended clearly above the base on {hard}: RL did not lift the hardest bucket within the budget, "
            "so steps to its target measure evaluation noise, not learning speed."
        )
    nosig = summary["no_signal_per_bucket"].get("uniform") or {}
    if nosig.get(hard) is not None:
        parts.append(f"Uniform's {hard} groups without reward variance: {nosig[hard]:.2f}.")
    parts.append(
        "Share of all groups without reward variance: "
        + ", ".join(f"{arm} {v:.2f}" for arm, v in summary["no_signal_frac"].items())
        + "."
    )
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=FAMILIES, default="countdown", help="the task family and its buckets")
    ap.add_argument(
        "--base-model", type=Path, default=None, help="HF directory of the base model (default: pretrain one)"
    )
    ap.add_argument(
        "--work", type=Path, default=Path("runs/bench_curriculum"), help="run directories and the cached base"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="also write the JSON here (e.g. docs/curriculum_bench.json)"
    )
    ap.add_argument("--seeds", type=int, default=3, help="RL seeds per arm")
    ap.add_argument("--steps", type=int, default=100, help="RL steps per run (the budget)")
    ap.add_argument("--eval-every", type=int, default=10, help="steps between evaluations")
    ap.add_argument(
        "--target",
        type=float,
        default=None,
        help="held-out accuracy (mean over buckets) that counts as reached (default: the base's + --target-gain)",
    )
    ap.add_argument(
        "--target-gain", type=float, default=0.10, help="default target: base mean accuracy + this"
    )
    ap.add_argument(
        "--hard-target",
        type=float,
        default=None,
        help="the hardest bucket's held-out accuracy that counts as reached (default: the base's + --hard-gain)",
    )
    ap.add_argument(
        "--hard-gain", type=float, default=0.05, help="default hardest-bucket target: base accuracy + this"
    )
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step (8 completions each)")
    ap.add_argument("--lr", type=float, default=3e-4, help="RL learning rate (keelrl demo's)")
    ap.add_argument("--temperature", type=float, default=1.0, help="RL sampling temperature (keelrl demo's)")
    ap.add_argument(
        "--max-new-tokens",
        type=int,
        default=0,
        help="0: the family's (countdown 32, multiply 24, countdown_set 48 or 128 restated, cipher 24, "
        "spell_backward 20)",
    )
    ap.add_argument("--eval-problems", type=int, default=200, help="held-out problems per bucket")
    ap.add_argument(
        "--pretrain-steps",
        type=int,
        default=None,
        help="pretrain the base for this many steps at lr 3e-3 (default: the family's stages; keelrl demo's "
        "800 steps, cipher 2000 + 2000 at lr 1e-3)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--jobs", type=int, default=3, help="runs trained at the same time (processes)")
    ap.add_argument(
        "--arms", default="curriculum,uniform,fixed_hard", help=f"comma-separated, from {', '.join(ARMS)}"
    )
    ap.add_argument("--dynamic", action="store_true", help="add the curriculum_dynamic arm")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="seconds (numbers that mean nothing): 1 seed, 2 steps of 4 prompts, 4 problems per bucket, a 3-step base",
    )
    a = ap.parse_args()
    if a.quick:
        a.seeds, a.steps, a.eval_every, a.eval_problems, a.pretrain_steps, a.prompts = 1, 2, 1, 4, 3, 4
    torch.set_num_threads(a.threads)
    fam = FAMILIES[a.family]
    a.max_new_tokens = a.max_new_tokens or fam.max_new_tokens
    stages = fam.pretrain_stages if a.pretrain_steps is None else ((a.pretrain_steps, 3e-3),)
    arms = a.arms.split(",") + (["curriculum_dynamic"] if a.dynamic else [])
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    a.work.mkdir(parents=True, exist_ok=True)
    started, load_start = time.time(), os.getloadavg()

    if a.base_model is not None:
        base, base_info = a.base_model, {"given": str(a.base_model)}
        if (base / "pretrain.json").exists():
            base_info.update(json.loads((base / "pretrain.json").read_text()))
    else:
        base = a.work / (f"base_{a.family}" + ("_quick" if a.quick else ""))
        if not cached_base_matches(a.family, base, stages):
            print(f"pretraining a base model into {base} ({stages} (steps, lr))", file=sys.stderr)
            shutil.rmtree(base, ignore_errors=True)
            pretrain_base(a.family, base, stages, 64, 0)
        base_info = (
            json.loads((base / "pretrain.json").read_text()) if (base / "pretrain.json").exists() else {}
        )
        base_info["path"] = str(base)
    buckets = buckets_of(fam)
    hard = buckets[-1]
    problems = {b: a.eval_problems for b in buckets}
    base_acc = evaluate_buckets(base, a.family, problems, a.max_new_tokens)
    base_acc["mean"] = statistics.mean(base_acc.values())
    if a.target is None:
        a.target = round(base_acc["mean"] + a.target_gain, 4)
    if a.hard_target is None:
        a.hard_target = round(base_acc[hard] + a.hard_gain, 4)
    print(f"base model accuracy: {base_acc}", file=sys.stderr)

    jobs = [(arm, seed) for seed in range(a.seeds) for arm in arms]
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_arm, arm, seed, base, a.work, a, problems) for arm, seed in jobs]
            for (arm, _), future in zip(jobs, futures):
                results[arm].append(future.result())
    else:
        for arm, seed in jobs:
            results[arm].append(run_arm(arm, seed, base, a.work, a, problems))

    summary = summarize_arms(results, a.steps)
    cur = summary["steps_to_hardest_bucket_target"].get("curriculum")
    uni = summary["steps_to_hardest_bucket_target"].get("uniform")
    if cur is not None and uni is not None:
        # the ratio of means, each arm's seeds resampled on their own
        ratios = seed_means(censored_as_budget(cur["per_seed"], a.steps), seed=0) / seed_means(
            censored_as_budget(uni["per_seed"], a.steps), seed=1
        )
        summary["curriculum_over_uniform_ci95"] = seed_interval(ratios)
    report: dict[str, Any] = {
        "benchmark": "curriculum",
        "command": "python " + " ".join(sys.argv),
        "quick": a.quick,
        "base_model": {**base_info, "accuracy": base_acc},
        "setup": {
            "family": a.family,
            "task": fam.task,
            "task_params": fam.params,
            "buckets": buckets,
            "hardest_bucket": hard,
            "arms": {arm: ARMS[arm] for arm in arms},
            "steps": a.steps,
            "eval_every": a.eval_every,
            "eval_problems": problems,
            "seeds": a.seeds,
            "target_accuracy": a.target,
            "target_on": f"mean held-out accuracy over the buckets {', '.join(buckets)} (greedy)",
            "hardest_bucket_target": a.hard_target,
            "jobs": a.jobs,
            "rl": {
                k: v
                for k, v in rl_config("curriculum", base, a.steps, 0, a).items()
                if k in ("rollout", "algo")
            },
        },
        **summary,
        "runs": results,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "torch_threads": a.threads,
        },
        "wall_seconds_total": time.time() - started,
    }
    if cur is not None and uni is not None:
        ratio = cur["mean"] / uni["mean"] if uni["mean"] else None
        report["curriculum_over_uniform_steps"] = ratio  # to the hardest bucket's target
        report["target_met"] = ratio is not None and ratio <= 2 / 3 and cur["censored"] == 0
    report["verdict"] = verdict(summary, base_acc, a, hard)
    text = json.dumps(report, indent=2)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
