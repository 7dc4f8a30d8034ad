"""Rejection-sampling fine-tuning (STaR, Zelikman et al. 2022): sample a policy on the task's training
problems, keep the completions the checker scores correct, and fine-tune on them (`keelrl rft` writes the
JSONL that `keelrl sft --set data.path=FILE` trains on; a run directory works as data.path too, giving
its logged correct rollouts).

Departures from STaR: no rationalization step (STaR also prompts with the answer as a hint for the
problems the model fails; a verifiable task here gives no answer string to hint with); each problem keeps at
most `per_problem` distinct correct completions, so the easy problems do not crowd out the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from keelrl.config import Config
from keelrl.monitor.run_dir import atomic_write_text


def collect_correct(
    cfg: Config, out: str | Path, problems: int, samples: int, per_problem: int, on_progress: Any = None
) -> dict[str, Any]:
    """Sample `samples` completions for each of the first `problems` training problems with cfg.model at
    cfg.rollout's settings (temperature, max_new_tokens), and write the distinct correct ones (at most
    `per_problem` per problem) to `out` as {problem, completion, reward} JSONL. Returns counts."""
    from keelrl.evals import run_eval
    from keelrl.models.load import load_policy
    from keelrl.rollout import SamplingSettings, make_sampler, resolve_template
    from keelrl.tasks import TaskError, get_task
    from keelrl.tasks.env import is_environment

    task = get_task(cfg.task.name, cfg.task.seed, cfg.sandbox, **cfg.task.params)
    if is_environment(task):
        raise TaskError(
            f"{cfg.task.name} is a multi-turn environment; keelrl rft keeps single-turn completions only (write "
            'its successful episodes as {"messages": [...]} records for keelrl sft instead)'
        )
    policy, tokenizer = load_policy(cfg.model)
    template = resolve_template(cfg.task.template, tokenizer)
    r = cfg.rollout
    results = run_eval(
        sampler=make_sampler(None, policy, tokenizer),  # in-process: it samples `policy` itself
        tokenizer=tokenizer,
        task=task,
        template=template,
        num_problems=problems,
        settings=SamplingSettings(r.max_new_tokens, r.temperature, r.top_p, r.top_k),
        samples=samples,
        seed=cfg.train.seed,
        batch_size=cfg.eval.batch_size,
        split="train",
        on_progress=on_progress,
    )
    kept: list[dict[str, Any]] = []
    solved = 0
    for res in results:
        seen: set[str] = set()
        for text, ok, reward in zip(res.texts, res.correct, res.rewards):
            if ok and text not in seen and len(seen) < per_problem:
                seen.add(text)
                kept.append({"problem": res.problem, "completion": text, "reward": reward})
        solved += bool(seen)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(k) + "\n" for k in kept))
    return {
        "problems": len(results),
        "sampled": sum(len(res.texts) for res in results),
        "correct": sum(sum(res.correct) for res in results),
        "kept": len(kept),
        "problems_solved": solved,
        "out": str(out),
    }
