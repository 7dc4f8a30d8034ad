"""Does multi-turn RL learn? countdown_tools (two numbers from 1..50, the demo's task) with a tiny model whose
pretraining taught the tool's format but not its use: each corpus episode calls `calc` on a random expression
of the numbers (target-blind, as the demo's corpus is), sees the value, then answers either that same
expression or a fresh random one, a coin flip whatever the value was. RL (the demo's settings, 100 steps of
128 episodes, up to 3 turns) must learn to keep the checked expression when the calculator showed the target
and to change it when it did not: conditioning a later turn on what the environment said.

Prints JSON: greedy held-out accuracy (500 problems) before and after with the paired change and its 95%
interval, turns and tool calls per episode, and the feedback use: of the episodes that called `calc` once and
answered, how often the answer is the checked expression when its value was the target and when it was not.

    python benchmarks/env_learning.py --seed 0 --out /tmp/env_learning --json docs/env_learning.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from demo_setup import QUICK_EVAL_PROBLEMS, QUICK_PLAN, quick_rl  # benchmarks/
from keelrl.recipes.demo import DEMO_TASK_PARAMS

# the demo's problems, with the tool environment's short opening
TASK_PARAMS: dict[str, Any] = {**DEMO_TASK_PARAMS, "brief": True}
EPISODE = {"max_turns": 3, "max_context_tokens": 180, "workers": 8}
MAX_NEW_TOKENS = 48  # a call "<tool_call>calc: 47*20</tool_call>" and its stop token are 35
_TURNS = re.compile(
    r"<tool_call>calc: (.*?)</tool_call>\nTool: (.*?)\nAssistant:<answer>(.*?)</answer>", re.DOTALL
)


def corpus_text(task: Any, index: int, seed: int) -> str:
    """One pretraining episode as the plain format writes it (see the module docstring)."""
    from keelrl.recipes.demo import in_order_expression
    from keelrl.tasks.countdown import random_expression
    from keelrl.tasks.countdown_tools import calc

    problem = task.problem("train", index)
    rng = random.Random(f"env-corpus-{seed}-{index}")
    numbers = sorted(problem["numbers"], reverse=True)
    while True:
        target = random_expression(numbers, rng)
        if target is not None and 1 <= target[1] <= TASK_PARAMS["max_target"]:
            break
    checked = in_order_expression(numbers, rng)
    answer = checked if rng.random() < 0.5 else in_order_expression(numbers, rng)
    return (
        f"User: {numbers[0]} {numbers[1]} -> {target[1]}\nAssistant:<tool_call>calc: {checked}</tool_call><eos>"
        f"\nTool: {calc(checked)}\nAssistant:<answer>{answer}</answer>"
    )


def base_model(out: Path, seed: int, quick: bool = False) -> Path:
    from keelrl.config import TinyModelConfig
    from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
    from keelrl.recipes.demo import DEMO_MODEL, DemoPlan, pretrain
    from keelrl.tasks import get_task

    path = out / f"seed{seed}" / "base"
    if (path / "config.json").exists():
        return path
    plan = QUICK_PLAN if quick else DemoPlan.for_minutes(12.0)
    task = get_task("countdown_tools", **TASK_PARAMS)
    tok = build_char_tokenizer()
    shape = {**DEMO_MODEL.model_dump(), "max_positions": 192, "init_seed": seed}
    model = build_tiny_model(TinyModelConfig(**shape), len(tok), tok.eos_token_id)
    pretrain(model, tok, lambda i: corpus_text(task, i, seed), plan.pretrain_steps, 64, 3e-3, seed)
    save_hf_dir(model, tok, path)
    return path


def evaluate(model_path: Path, seed: int, quick: bool = False) -> Any:
    from keelrl.config import EpisodeConfig, ModelConfig
    from keelrl.evals import evaluate as run
    from keelrl.models.load import load_policy
    from keelrl.rollout import make_sampler
    from keelrl.tasks import get_task

    policy, tok = load_policy(ModelConfig(path=str(model_path)))
    task = get_task("countdown_tools", **TASK_PARAMS)
    return run(
        make_sampler(None, policy, tok), tok, task, "compact", QUICK_EVAL_PROBLEMS if quick else 500,
        max_new_tokens=MAX_NEW_TOKENS, seed=seed,
        batch_size=128, limits=EpisodeConfig(**EPISODE),
    )  # fmt: skip


def feedback_use(report: Any) -> dict[str, Any]:
    """Of the greedy episodes with one calc call and an answer: P(answer == checked | value == target), and
    P(answer == checked | value != target)."""
    kept = {True: [0, 0], False: [0, 0]}  # value hit the target -> [kept the expression, episodes]
    for r in report.greedy:
        m = _TURNS.search(r.texts[0])
        if m is None:
            continue
        checked, value, answer = (g.strip() for g in m.groups())
        hit = value == str(r.problem["target"])
        kept[hit][0] += answer == checked
        kept[hit][1] += 1
    return {
        f"keep_when_{'hit' if hit else 'miss'}": round(k / n, 3) if n else None
        for hit, (k, n) in kept.items()
    } | {"episodes_hit": kept[True][1], "episodes_miss": kept[False][1]}


def main() -> None:
    from keelrl.config import config_from_dict
    from keelrl.evals import compare_results
    from keelrl.loop.trainer import train
    from keelrl.recipes.demo import DemoPlan, demo_rl_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/env_learning")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--quick", action="store_true", help="sizes of seconds (benchmarks/demo_setup.py's QUICK_*)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    out, seed = Path(args.out), args.seed
    t0 = time.time()
    base = base_model(out, seed, args.quick)
    before = evaluate(base, seed, args.quick)
    plan = QUICK_PLAN if args.quick else DemoPlan.for_minutes(12.0)
    cfg = demo_rl_config(str(base), TASK_PARAMS, plan.rl_steps, plan.eval_every, seed)
    if args.quick:
        quick_rl(cfg)
    cfg["task"]["name"] = "countdown_tools"
    cfg["rollout"]["max_new_tokens"] = MAX_NEW_TOKENS  # quick too: a tool call is 35 tokens
    cfg["episode"] = EPISODE
    cfg["log"]["progress"] = False
    run_dir = out / f"seed{seed}" / "rl"
    summary = train(config_from_dict(cfg, "env_learning"), run_dir, resume="auto")
    after = evaluate(run_dir / "final", seed, args.quick)
    diff = compare_results(before, after)["metrics"]["accuracy"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m for m in metrics if "episode/turns" in m]

    def summary_of(report: Any) -> dict[str, Any]:
        m = report.summary()["metrics"]
        return {
            "accuracy": m["accuracy"]["value"],
            "accuracy_ci95": m["accuracy"]["ci95"],
            "turns_mean": m["turns/mean"]["value"],
            "tool_calls_mean": m["tool_calls/mean"]["value"],
            **feedback_use(report),
        }

    doc = {
        "command": f"python benchmarks/env_learning.py --seed {seed} --out {args.out}"
        + (" --quick" if args.quick else ""),
        "quick": args.quick,
        "rl_steps": plan.rl_steps,
        "before": summary_of(before),
        "after": summary_of(after),
        "change": diff["diff"],
        "change_ci95": diff["ci"],
        "verdict": diff["verdict"],
        "train_reward_first_last_5": [
            round(statistics.fmean(m["reward/mean"] for m in train_steps[:5]), 3),
            round(statistics.fmean(m["reward/mean"] for m in train_steps[-5:]), 3),
        ],
        "state": summary["state"],
        "wall_s": round(time.time() - t0, 1),
    }
    text = json.dumps(doc, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
