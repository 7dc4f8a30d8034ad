"""Do the objectives learn? The demo's RL stage (Countdown, tiny model pretrained by `keelrl demo`'s recipe) with
each `algo.objective` (or an asynchronous variant: `async_k*`, rollout.max_staleness; or `selfplay`, where the
policy proposes its own problems and sees no training set), per seed: held-out accuracy (greedy, 500 problems) of
the base and of the final model, also per operation, the paired change with its 95% interval, and the first RL
step whose held-out eval (200 problems, every 20 steps) is 20 points above the step-0 eval. Prints JSON (and
writes it to --json).

Each seed pretrains its own base once (as `keelrl demo --seed N` does) and every objective starts from it.
`--minibatches` (default 2) splits each RL step's batch into that many optimizer steps: only then do tokens get
stale and the objectives differ (on-policy they have the same gradient, tests/unit/test_objectives_beyond_ppo.py);
`--lr` (default 1.5e-4: the demo's 3e-4 over the 2 steps) keeps the movement per batch near the demo's. A run
the guards stop is recorded as stopped, with its evals so far.

    python benchmarks/objectives_learning.py --seeds 0 1 2 --out /tmp/objectives --json docs/objectives_learning.json
    python benchmarks/objectives_learning.py --objectives ppo_clip async_k1 async_k2 --minibatches 1 --lr 3e-4 \
        --out /tmp/asyncl --json docs/async_learning.json   # the demo's RL stage as it is, k = 0, 1, 2
    python benchmarks/objectives_learning.py --objectives selfplay selfplay_worked --minibatches 1 --lr 1.5e-4 \
        --base /tmp/asyncl/seed0/base --out /tmp/sp   # self-play from one base (RESULTS "Self-play (issue 29)")
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from demo_setup import QUICK_EVAL_PROBLEMS, QUICK_PLAN, quick_rl  # benchmarks/

# what each name in --objectives sets: [algo] fields (besides minibatches and lr), and "rollout" ones
VARIANTS: dict[str, dict[str, Any]] = {
    "ppo_clip": {"objective": "ppo_clip"},
    "gspo": {"objective": "gspo"},
    "gspo_token": {"objective": "gspo_token"},
    "cispo": {"objective": "cispo"},
    # PPO with a learned critic, TinyZero's gamma = lam = 1; the value head starts at zero, so a higher critic
    # lr than TinyZero's 1e-5 (set for a 3B critic) lets it learn within 100 steps
    "critic_ppo": {"objective": "ppo_clip", "advantage": "gae", "gamma": 1.0, "lam": 1.0, "critic_lr": 1e-3},
    # asynchronous: the batch of step t sampled by version t - k, with the default correction (tis, C = 2) ...
    "async_k1": {"objective": "ppo_clip", "rollout": {"max_staleness": 1}},
    "async_k2": {"objective": "ppo_clip", "rollout": {"max_staleness": 2}},
    # ... and at a large k with the correction on and off: what goes wrong, and do the guards name it?
    "async_k8": {"objective": "ppo_clip", "rollout": {"max_staleness": 8}},
    "async_k8_off": {"objective": "ppo_clip", "correction": "off", "rollout": {"max_staleness": 8}},
    # self-play (issue 29): no training problems; the policy proposes them (train.stage = "selfplay"), the
    # demo's RL settings otherwise. 2 proposer prompts x 8 = 16 proposals fill at most the solver's 16 slots.
    "selfplay": {
        "objective": "ppo_clip",
        "train": {"stage": "selfplay"},
        "selfplay": {"proposer_prompts": 2},
    },
    # ... proposing worked lines, the target computed from the proposer's solution (selfplay.proposal)
    "selfplay_worked": {
        "objective": "ppo_clip",
        "train": {"stage": "selfplay"},
        "selfplay": {"proposer_prompts": 2, "proposal": "worked", "proposer_max_new_tokens": 40},
    },
    # ... with the proposer a policy of its own (selfplay.policies): each role trains only on its own rollouts
    "selfplay_two": {
        "objective": "ppo_clip",
        "train": {"stage": "selfplay"},
        "selfplay": {"proposer_prompts": 2, "policies": "two"},
    },
    "selfplay_worked_two": {
        "objective": "ppo_clip",
        "train": {"stage": "selfplay"},
        "selfplay": {
            "proposer_prompts": 2,
            "proposal": "worked",
            "proposer_max_new_tokens": 40,
            "policies": "two",
        },
    },
}
SECTIONS = ("rollout", "train", "selfplay")  # a variant's keys naming a config section; the rest are [algo]


def base_model(out: Path, seed: int, quick: bool = False) -> Path:
    """The demo's pretrained base for `seed` (made once; `quick`: QUICK_PLAN's 3 steps)."""
    from keelrl.config import TinyModelConfig
    from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
    from keelrl.recipes.demo import DEMO_MODEL, DEMO_TASK_PARAMS, DemoPlan, corpus_text, pretrain
    from keelrl.tasks import get_task

    path = out / f"seed{seed}" / "base"
    if (path / "config.json").exists():
        return path
    plan = QUICK_PLAN if quick else DemoPlan.for_minutes(12.0)
    task = get_task("countdown", **DEMO_TASK_PARAMS)
    tok = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(**{**DEMO_MODEL.model_dump(), "init_seed": seed}), len(tok), tok.eos_token_id
    )
    pretrain(
        model,
        tok,
        lambda i: corpus_text(task, i, seed),
        plan.pretrain_steps,
        plan.pretrain_batch,
        plan.pretrain_lr,
        seed,
    )
    save_hf_dir(model, tok, path)
    return path


def evaluate(model_path: Path, seed: int, quick: bool = False) -> Any:
    """Greedy held-out accuracy as `keelrl demo` measures it (500 problems; `quick`: 8)."""
    from keelrl.config import ModelConfig
    from keelrl.evals import evaluate as run_evaluate
    from keelrl.models.load import load_policy
    from keelrl.recipes.demo import DEMO_TASK_PARAMS, EVAL_PROBLEMS, demo_rl_config
    from keelrl.rollout import make_sampler
    from keelrl.tasks import get_task

    task = get_task("countdown", **DEMO_TASK_PARAMS)
    max_new = demo_rl_config("", DEMO_TASK_PARAMS, 1, 1, seed)["rollout"]["max_new_tokens"]
    policy, tok = load_policy(ModelConfig(path=str(model_path)))
    problems = QUICK_EVAL_PROBLEMS if quick else EVAL_PROBLEMS
    return run_evaluate(
        make_sampler(None, policy, tok), tok, task, "compact", problems, max_new_tokens=max_new, seed=seed,
        batch_size=128, meta={"model": str(model_path)},
    )  # fmt: skip


def by_operation(report: Any) -> dict[str, list[float]]:
    """Accuracy per operation that reaches the target (the demo's problems have two numbers): {op: [accuracy,
    problems]}; "*/" when both do (a target reached by two operations counts under both symbols)."""
    from fractions import Fraction

    tally: dict[str, list[int]] = {}
    for record in report.records:
        a, b = sorted(record.problem["numbers"], reverse=True)
        values = {"+": a + b, "-": a - b, "*": a * b, "/": Fraction(a, b)}
        op = "".join(k for k, v in values.items() if v == record.problem["target"]) or "?"
        counts = tally.setdefault(op, [0, 0])
        counts[0] += sum(record.correct) / len(record.correct)
        counts[1] += 1
    return {op: [round(c / n, 3), n] for op, (c, n) in sorted(tally.items())}


def one_run(
    out: Path,
    base: Path,
    base_report: Any,
    seed: int,
    objective: str,
    minibatches: int,
    lr: float,
    quick: bool = False,
) -> dict[str, Any]:
    from keelrl.config import config_from_dict
    from keelrl.evals import compare_results
    from keelrl.loop.trainer import train
    from keelrl.recipes.demo import DEMO_TASK_PARAMS, DemoPlan, demo_rl_config
    from keelrl.run.run import GuardStop

    plan = QUICK_PLAN if quick else DemoPlan.for_minutes(12.0)
    rl = demo_rl_config(str(base), DEMO_TASK_PARAMS, plan.rl_steps, plan.eval_every, seed)
    if quick:
        quick_rl(rl)
    variant = dict(VARIANTS[objective])
    for section in SECTIONS:
        rl.setdefault(section, {}).update(variant.pop(section, {}))
    rl["algo"].update(**variant, minibatches=minibatches, lr=lr)
    rl["log"]["progress"] = False
    run_dir = out / f"seed{seed}" / objective
    t0 = time.time()
    try:
        summary = train(config_from_dict(rl, "objectives_learning"), run_dir, resume="auto")
    except GuardStop as err:
        summary = {"state": f"stopped by the guards: {err}", "weights_sha256": None}
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(int(m["step"]), float(m["eval/accuracy"])) for m in metrics if "eval/accuracy" in m]
    start = next(acc for step, acc in evals if step == 0)
    reached = next((step for step, acc in evals if acc >= start + 0.20), None)
    result: dict[str, Any] = {"seed": seed, "objective": objective, "state": summary["state"]}
    if (run_dir / "final").exists():
        final = evaluate(run_dir / "final", seed, quick)
        diff = compare_results(base_report, final)["metrics"]["accuracy"]
        f = final.summary()["metrics"]["accuracy"]
        result.update(
            final=f["value"],
            final_ci95=f["ci95"],
            change=diff["diff"],
            change_ci95=diff["ci"],
            verdict=diff["verdict"],
            final_by_operation=by_operation(final),
        )
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    findings = [e for e in events if e["kind"] in ("guard", "skip", "rollback", "guard_stop")]
    return {
        **result,
        "evals": evals,
        "guard_findings": sorted({f"{e['kind']}:{e.get('rule', '')}" for e in findings}),
        "steps_to_plus_20": reached,
        "skipped_updates": int(sum(m.get("guard/skipped_updates", 0.0) for m in metrics)),
        "weights_sha256": summary["weights_sha256"],
        "wall_s": round(time.time() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--quick: 0)")
    ap.add_argument(
        "--objectives",
        nargs="+",
        default=None,
        choices=VARIANTS,
        help="default ppo_clip gspo cispo critic_ppo (--quick: ppo_clip)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="sizes of seconds (benchmarks/demo_setup.py's QUICK_*: a 3-step base, 2 RL steps of 32 completions, "
        "8-problem evals)",
    )
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1.5e-4)
    ap.add_argument("--out", default="/tmp/objectives")
    ap.add_argument(
        "--base",
        default="",
        help="start every seed from this model (default: each seed pretrains its own base)",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    args.objectives = args.objectives or (
        ["ppo_clip"] if args.quick else ["ppo_clip", "gspo", "cispo", "critic_ppo"]
    )
    torch.set_num_threads(1)
    out = Path(args.out)
    results: list[dict[str, Any]] = []
    bases: dict[int, float] = {}
    bases_by_op: dict[int, dict[str, list[float]]] = {}
    for seed in args.seeds:
        base = Path(args.base) if args.base else base_model(out, seed, args.quick)
        base_report = evaluate(base, seed, args.quick)
        bases[seed] = base_report.summary()["metrics"]["accuracy"]["value"]
        bases_by_op[seed] = by_operation(base_report)
        for objective in args.objectives:
            results.append(
                one_run(out, base, base_report, seed, objective, args.minibatches, args.lr, args.quick)
            )
            print(json.dumps(results[-1]), flush=True)
    doc = {
        "command": "python benchmarks/objectives_learning.py "
        + " ".join(
            f"--{k}" if v is True else f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if v
        ),
        "quick": args.quick,
        "minibatches": args.minibatches,
        "lr": args.lr,
        "base_accuracy": bases,
        "base_by_operation": bases_by_op,
        "runs": results,
    }
    text = json.dumps(doc, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
