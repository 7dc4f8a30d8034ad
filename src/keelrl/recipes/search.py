"""`keelrl demo --recipe search`: Stream of Search on three-number Countdown, on a laptop CPU.

1. Pretrain a tiny character model from scratch on search traces (tasks/countdown_search.py) of *train*
   problems: depth-first searches in random or heuristic order, with node budgets, so some traces wander and
   some give up (`?`). The model learns to search in text, not a fixed answer.
2. Evaluate it greedily on held-out problems (number sets never trained on), with behaviour statistics.
3. GRPO with keelrl's trainer on task "countdown_search" (TinyZero's reward: the Countdown checker on the
   last <answer>). `rollout.max_new_tokens` is a hard budget: a search that wanders or gives up earns
   nothing, so RL pays for searching in a better order, for not giving up, and for correct arithmetic.
4. Evaluate the final policy the same way; summary.json holds accuracy before/after, the paired difference
   with its 95% interval (`compare_results`), and the behaviour statistics before/after.

Pretraining (`keelrl.recipes.demo.pretrain`) is reused as is, on packed sequences (whole traces joined by <eos> up to
`pack_length` characters: twice the tokens per second of padding each batch to its longest trace); the
evaluation differs from recipes/demo.py's only in the problem count and in reading the behaviour numbers.

What was measured while designing it (held-out greedy accuracy; docs/RESULTS.md has the full numbers):
- With final-level checks in heuristic order, best-first traces put the hit first, and the base model put
  `!` on its first check whatever the value; GRPO at lr 3e-4 then collapsed to short lines with wrong
  arithmetic and a guessed answer (0.21 -> 0.13). Checks are now always in the order + - * /.
- The calibrated base model's search reaches the target in ~58% of held-out problems, but it misreads the
  comparison with the target (`!` on a wrong value) and repeats lines, so only ~19% end correct.
- GRPO at lr 1e-4 (batch 128 x 8) gains 15-20 points in 100 steps, but not by searching better: the traces
  shrink to one line (nodes ~14 -> 2, backtracks ~2.6 -> 0) whose intermediate numbers are mostly wrong
  while the final expression is right more often. Echoing the target on each line raised the base model
  (0.245) but halved the gain (+9). lr 3e-5 learned more slowly.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from keelrl.config import TinyModelConfig
from keelrl.recipes.demo import accuracy_fields, demo_rl_config, evaluate_path, pretrain
from keelrl.tasks.countdown_search import CORPUS_MIX, packed_corpus_text

# Countdown with three numbers from 1..20 and targets up to 100 (the 4-number variant: `task_params(4)`).
SEARCH_TASK_PARAMS: dict[str, Any] = {
    "min_numbers": 3,
    "max_numbers": 3,
    "min_number": 1,
    "max_number": 20,
    "max_target": 100,
    "test_fraction": 0.2,
}
SEARCH_MODEL = TinyModelConfig(hidden_size=128, num_layers=4, num_heads=4, max_positions=320)  # ~1.06M
EVAL_PROBLEMS = 500
# The default three-number plan took 12.0 minutes alone on one thread of this 2-core machine (docs/RESULTS.md):
# `--minutes` scales its step counts from there. The budget for the whole recipe is 30 minutes.
PLAN_MINUTES = 12.0


def task_params(numbers: int = 3) -> dict[str, Any]:
    """The recipe's Countdown parameters for problems of `numbers` numbers."""
    return {**SEARCH_TASK_PARAMS, "min_numbers": numbers, "max_numbers": numbers}


@dataclass(frozen=True)
class SearchPlan:
    """Work per stage (fixed counts keep a seed's result machine-independent; calibrated on one thread of a
    2-core machine: see docs/RESULTS.md)."""

    pretrain_steps: int = 800
    pretrain_batch: int = 16
    pack_length: int = 256
    echo_target: bool = False
    pretrain_lr: float = 3e-3
    rl_steps: int = 100
    rl_batch: int = 128
    group_size: int = 8
    rl_lr: float = 1e-4
    temperature: float = 1.0
    max_new_tokens: int = 200
    eval_every: int = 25
    eval_problems: int = EVAL_PROBLEMS
    rl_eval_problems: int = 100

    def scaled(self, minutes: float) -> SearchPlan:
        """This plan with pretraining and RL steps scaled by minutes / PLAN_MINUTES (what the default plan took)."""
        s = minutes / PLAN_MINUTES
        rl_steps = max(4, round(self.rl_steps * s))
        return replace(
            self,
            pretrain_steps=max(50, round(self.pretrain_steps * s)),
            rl_steps=rl_steps,
            eval_every=max(2, min(self.eval_every, rl_steps // 3)),
        )


def default_plan(numbers: int = 3) -> SearchPlan:
    """The calibrated plan (three numbers); four-number traces run longer (mean 180 characters, all under
    384), so their packs, token budget and context are longer, with fewer pretraining steps for the time."""
    if numbers <= 3:
        return SearchPlan()
    return SearchPlan(pretrain_steps=600, pack_length=384, max_new_tokens=320)


def search_rl_config(
    base_model: str, params: dict[str, Any], plan: SearchPlan, seed: int, threads: int = 1
) -> dict[str, Any]:
    """The RL stage's config: GRPO on countdown_search (compact template), demo.demo_rl_config's run at the
    plan's sizes."""
    cfg = demo_rl_config(base_model, params, plan.rl_steps, plan.eval_every, seed)
    cfg["task"]["name"] = "countdown_search"
    cfg["rollout"].update(
        batch_size=plan.rl_batch, group_size=plan.group_size, max_new_tokens=plan.max_new_tokens
    )
    cfg["rollout"]["temperature"] = plan.temperature
    cfg["algo"]["lr"] = plan.rl_lr
    cfg["train"]["threads"] = threads
    cfg["eval"].update(problems=plan.rl_eval_problems, at_start=False)
    cfg["checkpoint"]["keep_last"] = 1
    cfg["log"]["rollouts_per_step"] = 4
    return cfg


def evaluate_search(model_path: str, task: Any, plan: SearchPlan, seed: int) -> Any:
    """Greedy eval of `model_path` on the first `plan.eval_problems` test problems; the EvalReport's records
    carry each completion's behaviour numbers (evaluate.run_eval reads `task.behaviour`)."""
    return evaluate_path(None, model_path, task, "compact", plan.max_new_tokens, plan.eval_problems, seed)


def pretrain_search_model(
    out: Path, task: Any, plan: SearchPlan, seed: int, model_cfg: TinyModelConfig = SEARCH_MODEL
) -> dict[str, Any]:
    """Pretrain a tiny char model from scratch on search traces of train problems; saved to OUT/base."""
    from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir

    tokenizer = build_char_tokenizer()
    policy = build_tiny_model(
        model_cfg.model_copy(update={"init_seed": seed}), len(tokenizer), tokenizer.eos_token_id
    )
    result = pretrain(
        policy,
        tokenizer,
        lambda i: packed_corpus_text(task, i, seed, plan.pack_length, CORPUS_MIX, plan.echo_target),
        plan.pretrain_steps,
        plan.pretrain_batch,
        plan.pretrain_lr,
        seed,
    )
    save_hf_dir(policy, tokenizer, out / "base")
    return {"parameters": sum(p.numel() for p in policy.parameters()), **asdict(result)}


def _eval_summary(report: Any) -> dict[str, Any]:
    from keelrl.evals.run import behaviour_means

    return {**accuracy_fields(report.summary()), **behaviour_means(report.records)}


def run_search_demo(
    seed: int = 0,
    minutes: float = PLAN_MINUTES,
    out: str | Path = "runs/demo_search",
    numbers: int = 3,
    threads: int = 1,
    plan: SearchPlan | None = None,
) -> dict[str, Any]:
    """The whole search lifecycle (module docstring) for Countdown with `numbers` numbers; returns (and
    writes to OUT/summary.json) accuracy before/after RL, the paired difference with its 95% interval,
    behaviour statistics before/after and seconds per stage. `minutes` scales the default plan's steps (PLAN_MINUTES:
    the calibrated recipe); `plan` overrides it. `threads`: torch CPU threads (one is fastest on a shared
    machine, see demo.run_demo)."""
    if threads > 0:
        torch.set_num_threads(threads)
    from keelrl.config import config_from_dict
    from keelrl.evals import compare_results
    from keelrl.loop.trainer import train
    from keelrl.monitor.sinks import make_console
    from keelrl.tasks import get_task

    console = make_console(stderr=True, highlight=False)
    t_start = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = plan or default_plan(numbers).scaled(minutes)
    params = task_params(numbers)
    task = get_task("countdown_search", **params)
    seconds: dict[str, float] = {}

    console.rule(f"[bold]1/4 pretraining a tiny model on search traces[/] ({plan.pretrain_steps} steps)")
    t = time.time()
    model_cfg = TinyModelConfig(**{**SEARCH_MODEL.model_dump(), "max_positions": plan.pack_length + 64})
    pre = pretrain_search_model(out, task, plan, seed, model_cfg)
    seconds["pretrain"] = time.time() - t

    console.rule(f"[bold]2/4 evaluating it[/] ({plan.eval_problems} held-out {numbers}-number problems)")
    t = time.time()
    base = evaluate_search(str(out / "base"), task, plan, seed)
    seconds["eval_before"] = time.time() - t

    console.rule(f"[bold]3/4 RL[/] ({plan.rl_steps} steps of grpo, run dir {out / 'rl'})")
    t = time.time()
    cfg = config_from_dict(
        search_rl_config(str(out / "base"), params, plan, seed, threads), "keelrl demo search"
    )
    rl_summary = train(cfg, out / "rl", resume="never" if not (out / "rl").exists() else "auto")
    seconds["rl"] = time.time() - t

    console.rule("[bold]4/4 evaluating the final model[/]")
    t = time.time()
    final = evaluate_search(str(out / "rl" / "final"), task, plan, seed)
    seconds["eval_after"] = time.time() - t

    diff = compare_results(base, final)["metrics"]["accuracy"]
    (out / "eval_base.json").write_text(json.dumps(base.to_json(), indent=2))
    (out / "eval_final.json").write_text(json.dumps(final.to_json(), indent=2))
    before, after = _eval_summary(base), _eval_summary(final)
    summary = {
        "seed": seed,
        "numbers": numbers,
        "task_params": params,
        "plan": asdict(plan),
        "base_accuracy": before["accuracy"],
        "final_accuracy": after["accuracy"],
        "accuracy_change": diff["diff"],
        "accuracy_change_ci95": diff["ci"],
        "verdict": diff["verdict"],
        "before": before,
        "after": after,
        "pretrain": pre,
        "rl_steps": rl_summary.get("steps"),
        "seconds": {**seconds, "total": time.time() - t_start},
        "samples": [
            {"problem": b.problem, "before": b.texts[0][:200], "after": f.texts[0][:200]}
            for b, f in zip(base.records[:3], final.records[:3])
        ],
        "run_dir": str(out / "rl"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(console, summary, out)
    return summary


def print_summary(console: Any, summary: dict[str, Any], out: Path) -> None:
    """Accuracy before/after with the paired difference, and the behaviour statistics side by side."""
    from rich.table import Table

    b, a = summary["before"], summary["after"]
    lo, hi = summary["accuracy_change_ci95"]
    table = Table(title=f"held-out {summary['numbers']}-number Countdown, greedy (seed {summary['seed']})")
    for col in ("", "before RL", "after RL"):
        table.add_column(col)
    table.add_row("accuracy", f"{b['accuracy']:.3f}", f"{a['accuracy']:.3f}")
    for key in sorted(k for k in b if k.startswith("search/")):
        table.add_row(key.removeprefix("search/"), f"{b[key]:.3f}", f"{a.get(key, float('nan')):.3f}")
    console.print(table)
    console.print(
        f"change {summary['accuracy_change']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({summary['verdict']}); "
        f"{summary['seconds']['total'] / 60:.1f} min; summary {out / 'summary.json'}, run dir {out / 'rl'}"
    )
