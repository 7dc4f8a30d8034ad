"""`keelrl demo`: the whole post-training lifecycle in miniature, on a laptop CPU.

1. Pretrain a tiny base model (character tokenizer, about a million parameters) on a generated corpus.
2. Evaluate it (greedy) on held-out Countdown problems whose number sets never occur in training.
3. RL with the ordinary trainer (`keelrl.loop.trainer.train`): every metric, checkpoint and event of a real run.
4. Evaluate the final policy; print a before/after table with 95% intervals.

The task is Countdown with two numbers from 1..50 (TinyZero's reward rule): reach the target with one
operation. Each corpus line is a training problem's prompt (compact template, numbers largest first) and an
answer, e.g. `37 12 -> 444` / `<answer>37-12</answer><eos>`. The answer joins the numbers by a random
operation with a positive integer result; the prompt's target is an independent random expression of them.
So the corpus teaches the format, copying the numbers and "each number once", but not goal-directed solving:
a target-blind policy hits the target with probability p(target) under the answer generator, which
`chance_accuracy` computes exactly (about 0.33). RL has to learn to read the target and pick the operation.
The reward cannot be gamed: the Countdown checker evaluates the expression exactly.
What did not work (docs/RESULTS.md): three numbers with a stated value (`<answer>12*3-7=29</answer>`) left the
tiny model at 0% (its one-shot arithmetic was wrong); three numbers, answer only, gave a base model at chance
(11%) that GRPO did not move on held-out sets in 170 steps; step-by-step attempts with verdicts ("...=29 no;")
trained a base model that always wrote "no" (a "yes" is rare in a target-blind corpus), and RL only found a
target-blind habit.
"""

from __future__ import annotations

import contextlib
import math
import platform
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from keelrl.config import TinyModelConfig
from keelrl.core.seeds import stable_hash
from keelrl.tasks.countdown import Countdown, random_expression


def corpus_text(task: Countdown, index: int, seed: int, split: str = "train") -> str:
    """One pretraining example (compact template) for problem `index` of `split` (see the module docstring;
    the test split's lines measure a pretraining ladder's held-out loss)."""
    problem = task.problem(split, index)
    line, answer = target_blind_example(
        task, problem["numbers"], random.Random(stable_hash("corpus", seed, index))
    )
    return f"{line}\n<answer>{answer}</answer>"


def target_blind_example(task: Countdown, numbers: list[int], rng: random.Random) -> tuple[str, str]:
    """A compact prompt line for `numbers` with a random reachable target, and an answer that ignores the
    target: the numbers (largest first) joined by random operations (`in_order_expression`)."""
    numbers = sorted(numbers, reverse=True)
    while True:
        target = random_expression(numbers, rng)
        if target is not None and task.params.min_target <= target[1] <= task.params.max_target:
            break
    answer = in_order_expression(numbers, rng)
    return task.prompt({"numbers": numbers, "target": target[1]}, "compact").user, answer


def in_order_expression(numbers: list[int], rng: random.Random) -> str:
    """Numbers (largest first) joined by random operations with positive integer results: "37-12"."""
    text, value = str(numbers[0]), numbers[0]
    for n in numbers[1:]:
        ops = ["+", "*", "-"] if value > n else ["+", "*"]
        if n > 1 and value % n == 0:
            ops.append("/")
        op = rng.choice(ops)
        value = {"+": value + n, "*": value * n, "-": value - n, "/": value // n}[op]
        text = f"({text}){op}{n}" if text != str(numbers[0]) else f"{text}{op}{n}"
    return text


def value_distribution(numbers: list[int]) -> dict[int, float]:
    """Exact distribution of `in_order_expression`'s value, by enumerating its (uniform) choices."""

    def rec(value: int, rest: tuple[int, ...]) -> Counter:
        if not rest:
            return Counter({value: Fraction(1)})
        n = rest[0]
        ops = (
            [value + n, value * n]
            + ([value - n] if value > n else [])
            + ([value // n] if n > 1 and value % n == 0 else [])
        )
        out: Counter = Counter()
        for v in ops:
            for w, p in rec(v, rest[1:]).items():
                out[w] += p / len(ops)
        return out

    ordered = sorted(numbers, reverse=True)
    return {v: float(p) for v, p in rec(ordered[0], tuple(ordered[1:])).items()}


def chance_accuracy(problems: list[dict[str, Any]]) -> float:
    """Mean over problems of P(a target-blind draw of the corpus's answer generator hits the target)."""
    if not problems:
        return 0.0
    return sum(value_distribution(p["numbers"]).get(p["target"], 0.0) for p in problems) / len(problems)


@dataclass
class PretrainResult:
    steps: int
    tokens: int
    final_loss: float
    seconds: float


def pad_lines(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each text + EOS as one row, right-padded with EOS: (ids [B, T], labels [B, T]: the ids, and -100 on
    the padding, which the loss skips). Pretraining's batches and its held-out loss (ladder/pretrain_run.py)."""
    eos = tokenizer.eos_token_id
    seqs = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    ids = torch.full((len(seqs), max(map(len, seqs))), eos, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(seq)] = torch.tensor(seq)
    return ids, labels


def pretrain(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    make_text: Callable[[int], str],
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> PretrainResult:
    """Next-token training (EOS in, padding masked) on make_text(i); AdamW, linear warm-up, cosine decay."""
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))),
    )
    t0 = time.perf_counter()
    tokens = 0
    loss_value = float("nan")
    for step in range(steps):
        ids, labels = pad_lines(tokenizer, [make_text(step * batch_size + i) for i in range(batch_size)])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        tokens += int((labels != -100).sum())
        loss_value = loss.item()
        if on_step is not None:
            on_step(step + 1, loss_value)
    model.eval()
    return PretrainResult(steps, tokens, loss_value, time.perf_counter() - t0)


# The task of the demo: Countdown with 2 numbers from 1..99; a quarter of the number pairs is held out.
DEMO_TASK_PARAMS: dict[str, Any] = {
    "min_numbers": 2,
    "max_numbers": 2,
    "min_number": 1,
    "max_number": 50,
    "max_target": 2500,
    "test_fraction": 0.3,
}
DEMO_MODEL = TinyModelConfig(hidden_size=128, num_layers=4, num_heads=4, max_positions=64)
EVAL_PROBLEMS = 500


@dataclass(frozen=True)
class DemoPlan:
    """Work per stage: fixed step counts keep a seed's result machine-independent; `--minutes` scales them
    (calibrated on a 2-core laptop-class CPU)."""

    pretrain_steps: int
    pretrain_batch: int
    pretrain_lr: float
    rl_steps: int
    eval_every: int

    @staticmethod
    def for_minutes(minutes: float) -> DemoPlan:
        scale = minutes / 12.0
        rl_steps = max(10, round(RL_STEPS_AT_12_MIN * scale / 10) * 10)
        return DemoPlan(
            pretrain_steps=max(50, round(PRETRAIN_STEPS_AT_12_MIN * scale)),
            pretrain_batch=64,
            pretrain_lr=3e-3,
            rl_steps=rl_steps,
            eval_every=max(10, rl_steps // 5),  # held-out evals during RL pick the best checkpoint
        )


PRETRAIN_STEPS_AT_12_MIN = 800
RL_STEPS_AT_12_MIN = 100


def demo_rl_config(
    base_model: str, task_params: dict[str, Any], steps: int, eval_every: int, seed: int
) -> dict[str, Any]:
    """The RL stage's config. configs/countdown_tiny.toml is the same run (tests/unit/test_configs.py)."""
    return {
        "model": {"path": base_model},
        "task": {"name": "countdown", "template": "compact", "params": task_params, "seed": 0},
        "rollout": {"batch_size": 128, "group_size": 8, "max_new_tokens": 24, "temperature": 1.0},
        "algo": {
            "lr": 3e-4,
            "advantage": "grpo",
            "loss_agg": "token_mean",
            "clip_low": 0.2,
            "clip_high": 0.28,
        },
        "train": {"steps": steps, "micro_batch_size": 32, "seed": seed, "threads": torch.get_num_threads()},
        "eval": {"every_steps": eval_every, "problems": 200, "at_start": True},
        "checkpoint": {"every_steps": eval_every, "keep_last": 2, "keep_best": 1},
        "log": {"rollouts_per_step": 8},
        "supervisor": {"enabled": False},
    }


def run_demo(
    seed: int = 0,
    minutes: float = 12.0,
    out: str | Path = "runs/demo",
    threads: int = 1,
    engine: str = "hf",
) -> dict[str, Any]:
    """The whole lifecycle; returns (and writes to OUT/summary.json) the before/after numbers. `threads`:
    torch's CPU threads, default one: the tiny model's kernels are too small for a second to pay much, and
    OpenMP threads stall badly (10x measured here) when another program competes for the cores. `engine`:
    what samples during RL (rollout.engine); the evaluations before and after always use keelrl's sampler."""
    if threads > 0:
        torch.set_num_threads(threads)
    from keelrl.config import config_from_dict
    from keelrl.loop.trainer import train
    from keelrl.models.load import build_char_tokenizer, build_tiny_model, save_hf_dir
    from keelrl.monitor.sinks import ProgressBar, make_console
    from keelrl.tasks import get_task

    console = make_console(stderr=True, highlight=False)
    t_start = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = DemoPlan.for_minutes(minutes)
    base_dir = out / "base"
    task_params = DEMO_TASK_PARAMS
    task = get_task("countdown", **task_params)
    console.rule(
        f"[bold]1/4 pretraining a tiny base model[/] ({plan.pretrain_steps} steps of next-token loss)"
    )
    tokenizer = build_char_tokenizer()
    policy = build_tiny_model(
        DEMO_MODEL.model_copy(update={"init_seed": seed}), len(tokenizer), tokenizer.eos_token_id
    )
    with ProgressBar(console, "pretrain", plan.pretrain_steps) as advance:
        result = pretrain(
            policy,
            tokenizer,
            lambda i: corpus_text(task, i, seed),
            plan.pretrain_steps,
            plan.pretrain_batch,
            plan.pretrain_lr,
            seed,
            on_step=lambda step, loss: advance(info=f"loss {loss:.3f}"),
        )
    save_hf_dir(policy, tokenizer, base_dir)
    console.print(
        f"base model: {sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters, "
        f"{result.tokens / 1e6:.2f}M tokens in {result.seconds:.0f} s, final loss {result.final_loss:.3f}"
    )
    template = "compact"
    base_path = str(base_dir)
    rl = demo_rl_config(base_path, task_params, plan.rl_steps, plan.eval_every, seed)
    rl["rollout"]["engine"] = engine
    problems = [task.problem("test", i) for i in range(EVAL_PROBLEMS)]
    chance = chance_accuracy(problems)
    console.rule("[bold]2/4 evaluating the base model[/]")
    max_new_tokens = rl["rollout"]["max_new_tokens"]
    base_report = evaluate_path(console, base_path, task, template, max_new_tokens, EVAL_PROBLEMS, seed)

    console.rule(
        f"[bold]3/4 RL[/] ({rl['train']['steps']} steps of {rl['algo']['advantage']}, run dir {out / 'rl'})"
    )
    cfg = config_from_dict(rl, "keelrl demo")
    summary_rl = train(cfg, out / "rl", resume="never" if not (out / "rl").exists() else "auto")

    console.rule("[bold]4/4 evaluating the final model[/]")
    final_report = evaluate_path(
        console, str(out / "rl" / "final"), task, template, max_new_tokens, EVAL_PROBLEMS, seed
    )
    return _summarize(console, out, seed, chance, base_report, final_report, summary_rl, t_start)


def evaluate_path(
    console: Any, model_path: str, task: Any, template: str, max_new_tokens: int, problems: int, seed: int
) -> Any:
    """`evaluate_policy` of the model at `model_path` (loaded as `model.path` would be)."""
    from keelrl.config import ModelConfig
    from keelrl.models.load import load_policy

    policy, tokenizer = load_policy(ModelConfig(path=model_path))
    return evaluate_policy(
        console, policy, tokenizer, task, template, max_new_tokens, problems, seed, model_path
    )


def evaluate_policy(
    console: Any,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Any,
    template: str,
    max_new_tokens: int,
    problems: int,
    seed: int,
    name: str,
) -> Any:
    """Greedy eval of `policy` on the first `problems` held-out problems with keelrl's sampler, with a progress
    bar on `console` (None: no bar)."""
    from keelrl.evals import evaluate
    from keelrl.monitor.sinks import ProgressBar
    from keelrl.rollout import make_sampler

    bar = contextlib.nullcontext() if console is None else ProgressBar(console, "eval", problems)
    with bar as advance:
        return evaluate(
            make_sampler(None, policy, tokenizer),
            tokenizer,
            task,
            template,  # type: ignore[arg-type]
            problems,
            max_new_tokens=max_new_tokens,
            seed=seed,
            batch_size=128,
            meta={"model": name},
            on_progress=advance,
        )


def _summarize(
    console: Any,
    out: Path,
    seed: int,
    chance: float,
    base: Any,
    final: Any,
    rl_summary: dict[str, Any],
    t_start: float,
) -> dict[str, Any]:
    import json
    import resource

    from rich.table import Table

    from keelrl.evals import compare_results

    b, f = base.summary(), final.summary()
    comparison = compare_results(base, final)
    (out / "eval_base.json").write_text(json.dumps(base.to_json(), indent=2))
    (out / "eval_final.json").write_text(json.dumps(final.to_json(), indent=2))
    diff = comparison["metrics"]["accuracy"]
    table = Table(title=f"held-out Countdown, greedy, {len(base.records)} problems (seed {seed})")
    for col in ("", "accuracy", "95% interval", "mean reward", "format rate"):
        table.add_column(col)
    for name, s in (("base model", b), ("after RL", f)):
        m = s["metrics"]
        lo, hi = m["accuracy"]["ci95"]
        table.add_row(
            name,
            f"{m['accuracy']['value']:.3f}",
            f"[{lo:.3f}, {hi:.3f}]",
            f"{m['reward/mean']['value']:.3f}",
            f"{m['format_rate']['value']:.2f}",
        )
    table.add_row(
        "change", f"{diff['diff']:+.3f}", f"[{diff['ci'][0]:+.3f}, {diff['ci'][1]:+.3f}]", "", diff["verdict"]
    )
    table.add_row("chance", f"{chance:.3f}", "", "", "")
    console.print(table)
    console.print("[bold]sample completions[/] (same problems, before -> after):")
    for i in range(3):
        p = base.records[i].problem
        console.print(f"  {p['numbers']} -> {p['target']}", markup=False)
        console.print(f"    before: {base.records[i].texts[0][:150]}", markup=False)
        console.print(f"    after:  {final.records[i].texts[0][:150]}", markup=False)
    wall = time.time() - t_start
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    summary = {
        "seed": seed,
        **accuracy_fields(b, "base_"),
        **accuracy_fields(f, "final_"),
        "accuracy_change": diff["diff"],
        "accuracy_change_ci95": diff["ci"],
        "verdict": diff["verdict"],
        "chance_accuracy": chance,
        "eval_problems": len(base.records),
        "best_checkpoint": rl_summary.get("best"),
        "rl_steps": rl_summary.get("steps"),
        "wall_seconds": wall,
        "peak_rss_gb": peak_rss_gb,
        "run_dir": str(out / "rl"),
        "cpu": cpu_model(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(
        f"run directory: {out / 'rl'} (metrics, rollouts, checkpoints incl. best), summary: {out / 'summary.json'}; "
        f"{wall / 60:.1f} min, peak RSS {peak_rss_gb:.2f} GB. Next: keelrl doctor {out / 'rl'} ; keelrl report {out / 'rl'}"
    )
    console.print(
        f"These digits are exact for this CPU model ({summary['cpu']}): the same seed repeats them on it. Another "
        "model's kernels round differently and the many training steps amplify that, so it gives other digits and "
        "a like gain (seed 0: 0.288 -> 0.748 on an Intel Xeon, 0.320 -> 0.696 on an AMD EPYC)."
    )
    return summary


def accuracy_fields(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """An eval report's summary's accuracy and its 95% interval, as `{prefix}accuracy` and
    `{prefix}accuracy_ci95`."""
    m = summary["metrics"]["accuracy"]
    return {f"{prefix}accuracy": m["value"], f"{prefix}accuracy_ci95": m["ci95"]}


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo): what a demo's exact digits hold for."""
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
