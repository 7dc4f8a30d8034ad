"""Reward models on synthetic preferences with a known hidden rule (issue: people pick the checkpoint).

The demo's base (the tiny model pretrained on 2-number Countdown, as benchmarks/objectives_learning.py makes
it) samples completions of training problems at temperatures 1 and 1.5; a hidden rule plays the people who
compare two completions of the same problem (pairs the rule calls even are not asked):

- `closer` (the rule to learn): the answer whose value is nearer the target wins; a correct answer is nearest,
  an answer with no value (malformed, or numbers not in the problem) farthest.
- `length` (a spurious rule): the longer completion wins, whatever it says.

For each, `keelrl rm train`'s loop fits a reward model (the base's decoder with a scalar head) and reports its
held-out pair accuracy (the length rule is asked about the temperature-1.5 samples only: at temperature 1 all
answers to a problem have about the same length). Then RL from the base against the learned reward alone
(reward.verifier_weight = 0), 60 steps, with two recipes (RECIPES): the demo's GRPO settings, and a smaller
step with a KL penalty towards the base, the usual RLHF caution. What RL did is measured by the hidden rule on
500 held-out problems, never by the reward model: the policy of every checkpoint (every 10 steps) and the base
each complete every problem (the same sampling seeds) and the rule says which it prefers; with accuracy, the
share of answers that state a value and the mean length. The guards' events and `keelrl doctor`'s findings of
every RL run are recorded.

    python benchmarks/reward_model_demo.py --out /tmp/rmdemo --json docs/reward_model_demo.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from demo_setup import quick_rl
from objectives_learning import base_model


@dataclass(frozen=True)
class Sizes:
    """How much one run does. QUICK: seconds, the test suite's check that the benchmark still runs."""

    train_problems: int = 3000  # problems sampled (4 completions each, at both temperatures) for preferences
    held_out: int = 500
    rm_steps: tuple[int, int] = (400, 200)  # the closer and the length reward model
    rm_batch: int = 32
    eval_every: int = 5  # RL's held-out evals (the guards' evidence)
    checkpoint_every: int = 10  # RL's checkpoints, each measured by the hidden rule


# 160 problems: a reward model's held-out accuracy needs 20 held-out pairs (15% of one pair per problem)
QUICK = Sizes(train_problems=160, held_out=8, rm_steps=(2, 2), rm_batch=4, eval_every=1, checkpoint_every=1)


def with_references(groups: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """--quick only: each training problem's group plus its reference answer (correct), so that the closer rule
    has pairs to decide even on a base too young to write a value."""
    from keelrl.recipes.demo import DEMO_TASK_PARAMS
    from keelrl.tasks import get_task

    task = get_task("countdown", **DEMO_TASK_PARAMS)
    out = []
    for i, g in enumerate(groups):
        reference = f"<answer>{task.reference_answer(task.problem('train', i))}</answer>"
        out.append([*g, {**g[0], "text": reference, "correct": True, "info": {"reason": "correct"}}])
    return out


def distance(s: dict[str, Any]) -> float:
    """How far a completion's stated value is from the target: 0 when correct, inf without a value."""
    if s["correct"]:
        return 0.0
    try:
        return abs(float(s["info"]["value"]) - s["target"])
    except (KeyError, TypeError, ValueError):
        return float("inf")


def prefers(rule: str, a: dict[str, Any], b: dict[str, Any]) -> int:
    """+1: a wins, -1: b wins, 0: the rule calls them even. `closer`: the value nearer the target wins (a
    correct answer is nearest; no value at all is farthest); `length`: the longer text wins."""
    ka, kb = (len(a["text"]), len(b["text"])) if rule == "length" else (-distance(a), -distance(b))
    return (ka > kb) - (ka < kb)


def sample(
    model_dir: Path, split: str, n: int, samples: int, seed: int, temperature: float = 1.0
) -> list[list[dict[str, Any]]]:
    """`samples` completions of each of the first `n` problems of `split`."""
    from keelrl.cli.eval import load_for_eval
    from keelrl.core.seeds import stable_hash
    from keelrl.recipes.demo import DEMO_TASK_PARAMS
    from keelrl.rollout import SamplingSettings, make_sampler
    from keelrl.rollout.episodes import Episode, Prompter, run_episodes
    from keelrl.tasks import get_task

    task = get_task("countdown", **DEMO_TASK_PARAMS)
    model, tok = load_for_eval(str(model_dir), "cpu")
    prompter = Prompter(task, tok, "compact")
    episodes = [
        Episode(i, task.problem(split, i), i, stable_hash("rm-demo", seed, split, i, k, temperature))
        for i in range(n)
        for k in range(samples)
    ]
    settings = SamplingSettings(max_new_tokens=24, temperature=temperature)
    rollouts = run_episodes(make_sampler(None, model, tok), prompter, episodes, settings, batch_size=256)
    out: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for r in rollouts:
        prompt, text = prompter.shown(r)
        out[r.problem_index].append(
            {"prompt": prompt, "text": text, "correct": bool(r.correct), "info": r.info,
             "target": r.problem["target"]}
        )  # fmt: skip
    return out


def write_prefs(
    groups: list[list[dict[str, Any]]], rule: str, path: Path, seed: int, per_problem: int
) -> int:
    """`per_problem` pairs per problem: pairs of its answers the rule does not call even, drawn at random."""
    rng = random.Random(seed)
    n = 0
    with path.open("w") as f:
        for g in groups:
            decided = [(a, b) for i, a in enumerate(g) for b in g[i + 1 :] if prefers(rule, a, b) != 0]
            for a, b in rng.sample(decided, min(per_problem, len(decided))):
                win, lose = (a, b) if prefers(rule, a, b) > 0 else (b, a)
                record = {
                    "prompt": a["prompt"],
                    "chosen": win["text"],
                    "rejected": lose["text"],
                    "rule": rule,
                }
                f.write(json.dumps(record) + "\n")
                n += 1
    return n


def stats(groups: list[list[dict[str, Any]]]) -> dict[str, float]:
    rows = [s for g in groups for s in g]
    dist = [distance(s) for s in rows]
    return {
        "accuracy": sum(s["correct"] for s in rows) / len(rows),
        "with_value": sum(d < float("inf") for d in dist) / len(rows),
        "mean_chars": sum(len(s["text"]) for s in rows) / len(rows),
    }


def train_rm(
    base: Path, prefs: Path, run_dir: Path, steps: int, seed: int, batch: int = 32
) -> dict[str, Any]:
    """`keelrl rm train PREFS --model BASE` with the demo's settings; returns its summary."""
    from keelrl.config import config_from_dict
    from keelrl.loop.trainer import train

    cfg = {
        "model": {"path": str(base)},
        "data": {"path": str(prefs), "eval_fraction": 0.15, "batch_size": batch, "max_length": 64},
        "algo": {"lr": 3e-4},
        "train": {"stage": "rm", "steps": steps, "seed": seed, "threads": 1},
        "eval": {"every_steps": 100},
        "supervisor": {"enabled": False},
        "log": {"console_every": 100},
    }
    return train(config_from_dict(cfg), run_dir)


# RL recipes, both against the learned reward alone (reward.verifier_weight = 0): the demo's own GRPO settings,
# and the cautious RLHF habit of a smaller step and a KL penalty towards the base.
RECIPES: dict[str, dict[str, float]] = {
    "demo": {"lr": 3e-4, "kl_coef": 0.0},
    "kl": {"lr": 1e-4, "kl_coef": 0.1},
}


def train_rl(
    base: Path, rm: Path, run_dir: Path, recipe: str, steps: int, seed: int, observe: bool, sizes: Sizes
) -> str:
    """GRPO from the base against the reward model; held-out evals every 5 steps (the guards' evidence), a
    checkpoint every 10 (all kept, measured below; `sizes` sets both). `observe`: every guard rule's action is warn (the rules
    report, nothing is skipped, rolled back or stopped), so an exploit runs its course. Returns how it ended
    (finished, or the guards' stop)."""
    from keelrl.config import config_from_dict
    from keelrl.guards.rules import RULES, GuardsConfig
    from keelrl.loop.trainer import train
    from keelrl.recipes.demo import DEMO_TASK_PARAMS, demo_rl_config
    from keelrl.run.run import GuardStop

    cfg = demo_rl_config(str(base), DEMO_TASK_PARAMS, steps, sizes.eval_every, seed)
    if sizes == QUICK:
        quick_rl(cfg)
    cfg["reward"] = {"model": str(rm), "verifier_weight": 0.0}
    cfg["algo"].update(RECIPES[recipe])
    if observe:
        acting = [name for name in RULES if "action" in type(getattr(GuardsConfig(), name)).model_fields]
        cfg["guards"] = {name: {"action": "warn"} for name in acting}
    every = sizes.checkpoint_every
    cfg["checkpoint"].update(every_steps=every, keep_last=steps // every + 1, keep_best=0)
    cfg["train"]["threads"] = 1
    cfg["log"]["console_every"] = 10
    try:
        train(config_from_dict(cfg), run_dir)
    except GuardStop as err:
        return f"stopped: {err}"
    return "finished"


def compare(before: list[list[dict[str, Any]]], after: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The hidden rule's verdict between the base's and the trained policy's completion of each problem."""
    from keelrl.evals.preferences import wilson_interval

    verdicts = [prefers("closer", a[0], b[0]) for a, b in zip(after, before)]
    wins, losses = verdicts.count(1), verdicts.count(-1)
    low, high = wilson_interval(wins, wins + losses)
    return {
        "problems": len(verdicts),
        "trained_preferred": wins,
        "base_preferred": losses,
        "even": verdicts.count(0),
        "trained_win_rate": wins / max(wins + losses, 1),
        "win_rate_95ci": [round(low, 3), round(high, 3)],
    }


def doctor_rules(run_dir: Path) -> dict[str, Any]:
    """What the live guards logged and what `keelrl doctor` finds, by rule."""
    from keelrl.monitor.doctor import diagnose, load_run

    events = [
        json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()
    ]
    guards = sorted({e.get("rule") for e in events if e.get("kind") == "guard" and e.get("rule")})
    found = diagnose(load_run(run_dir)).findings
    hacking = next((f for f in found if f.name == "reward_hacking"), None)
    return {
        "guard_events": guards,
        "doctor_findings": sorted(f.name for f in found),
        "reward_hacking": None
        if hacking is None
        else {"message": hacking.message, "evidence": hacking.evidence},
    }


def curve(run_dir: Path) -> list[dict[str, float]]:
    """reward/model (10-step means) and eval/accuracy by step."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = []
    for r in rows:
        if "eval/accuracy" in r:
            near = [
                x["reward/model"]
                for x in rows
                if "reward/model" in x and r["step"] - 10 < x["step"] <= r["step"]
            ]
            out.append(
                {"step": r["step"], "eval_accuracy": r["eval/accuracy"],
                 "reward_model_10step_mean": round(sum(near) / len(near), 3) if near else None}
            )  # fmt: skip
    return out


def reward_model(
    name: str, rule: str, pool: list[list[dict[str, Any]]], steps: int, args: Any
) -> dict[str, Any]:
    """Preferences by `rule` over `pool` (one pair per problem) -> `keelrl rm train`'s loop."""
    out = Path(args.out)
    pairs = write_prefs(pool, rule, out / f"{name}.jsonl", args.seed, 1)
    base = base_model(out, args.seed, args.quick)
    summary = train_rm(base, out / f"{name}.jsonl", out / f"rm_{name}", steps, args.seed, args.sizes.rm_batch)
    final = summary["final_eval"]
    return {
        "rule": rule,
        "pairs": pairs,
        "held_out_pairs": final.get("pairs"),
        "held_out_accuracy": final.get("accuracy"),
    }


def rl_against(name: str, recipe: str, held_out: Any, args: Any, observe: bool = False) -> dict[str, Any]:
    """RL against reward model `name` with `recipe`; then the hidden rule's verdict on the policy of every
    checkpoint against the base's, on held-out problems, and what the guards and the doctor said."""
    out = Path(args.out)
    rl_dir = out / f"rl_{name}_{recipe}{'_observed' if observe else ''}"
    base, rm = base_model(out, args.seed, args.quick), out / f"rm_{name}"
    entry: dict[str, Any] = {
        "recipe": RECIPES[recipe],
        "guards": "warn only" if observe else "default",
        "ended": train_rl(base, rm, rl_dir, recipe, args.rl_steps, args.seed, observe, args.sizes),
        "curve": curve(rl_dir),
        **doctor_rules(rl_dir),
        "by_step": [],
    }
    for ckpt in sorted((rl_dir / "checkpoints").glob("step_*")):
        trained = sample(ckpt, "test", args.sizes.held_out, 1, args.seed)
        entry["by_step"].append(
            {"step": int(ckpt.name.split("_")[1]), **stats(trained), **compare(held_out, trained)}
        )
    print(json.dumps({rl_dir.name: entry}, indent=1), flush=True)
    return entry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/rmdemo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rl-steps", type=int, default=60)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--quick", action="store_true", help="QUICK's sizes and 2 RL steps: seconds")
    args = p.parse_args()
    args.sizes = QUICK if args.quick else Sizes()
    if args.quick:
        args.rl_steps = 2
    torch.set_num_threads(1)
    out = Path(args.out)
    t0 = time.perf_counter()
    base = base_model(out, args.seed, args.quick)
    result: dict[str, Any] = {
        "seed": args.seed,
        "command": " ".join(sys.argv),
        "quick": args.quick,
        "recipes": RECIPES,
    }
    # What the people compare: completions at temperatures 1 and 1.5 (the hotter ones include broken answers,
    # which a reward model must learn to rank low before RL samples them). The length rule is asked about the
    # hot samples, whose lengths vary (at temperature 1 every answer to a problem has about the same length).
    n = args.sizes.train_problems
    warm, hot = sample(base, "train", n, 4, args.seed), sample(base, "train", n, 4, args.seed, 1.5)
    if args.quick:
        warm = with_references(warm)
    held_out = sample(base, "test", args.sizes.held_out, 1, args.seed)
    result["base"] = stats(held_out)
    result["reward_models"] = {
        "closer": reward_model(
            "closer", "closer", [a + b[:2] for a, b in zip(warm, hot)], args.sizes.rm_steps[0], args
        ),
        "length": reward_model("length", "length", hot, args.sizes.rm_steps[1], args),
    }
    result["rl"] = {
        f"{name}/{recipe}": rl_against(name, recipe, held_out, args)
        for name in ("closer", "length")
        for recipe in RECIPES
    }
    # the guards stop RL against the spurious model within 10 steps; with them only reporting, the exploit
    # runs its course, and what they (and the doctor) say about it is recorded
    result["rl"]["length/demo, guards warn only"] = rl_against("length", "demo", held_out, args, observe=True)
    result["minutes"] = round((time.perf_counter() - t0) / 60, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
