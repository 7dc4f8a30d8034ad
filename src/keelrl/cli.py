"""Command line: parse, load config, call one function. `python -m keelrl` is the same as `keelrl`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from keelrl.config import ConfigError, describe_fields, load_config



def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the user asked for something impossible: printed as one paragraph, exit 2."""
    from keelrl.checkpoint import CheckpointError
    from keelrl.models import ModelLoadError
    from keelrl.tasks import TaskError
    from keelrl.trainer import ResumeError

    return (ConfigError, ModelLoadError, TaskError, ResumeError, CheckpointError)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / Path(args.config).stem
    from keelrl.trainer import train

    summary = train(cfg, run_dir, resume=args.resume)
    final = summary.get("final_eval", {})
    print(
        f"done: {summary.get('steps')} steps, final eval accuracy {final.get('accuracy', float('nan')):.3f}, "
        f"run dir {run_dir}"
    )
    return 0


def run_config_near(model_path: str) -> dict[str, Any] | None:
    """The resolved config of the run a checkpoint or final/ directory came from, if there is one."""
    p = Path(model_path)
    if not p.exists():
        return None
    p = p.resolve()
    state = p / "state.json"
    if state.is_file():
        return json.loads(state.read_text()).get("config")
    for parent in (p.parent, p.parent.parent):
        cfg = parent / "config.json"
        if cfg.is_file() and (parent / "metrics.jsonl").exists():
            return json.loads(cfg.read_text())
    return None


def cmd_eval(args: argparse.Namespace) -> int:
    from keelrl.config import ModelConfig
    from keelrl.evaluate import timed_eval
    from keelrl.models import load_policy
    from keelrl.rollout import HFSampler, SamplingSettings, resolve_template
    from keelrl.tasks import get_task

    run_cfg = run_config_near(args.model) or {}
    task_cfg = run_cfg.get("task", {}) if run_cfg.get("task", {}).get("name") == args.task else {}
    params = dict(task_cfg.get("params", {}))
    for item in args.task_param:
        if "=" not in item:
            raise ConfigError(f"--task-param expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        params[key] = json.loads(value) if value.strip()[:1] in "0123456789-[{tf" else value
    task = get_task(args.task, seed=int(task_cfg.get("seed", 0)), **params)
    model, tokenizer = load_policy(ModelConfig(path=args.model))
    template = resolve_template(args.template or task_cfg.get("template", "auto"), tokenizer)
    max_new = args.max_new_tokens or run_cfg.get("rollout", {}).get("max_new_tokens", 256)
    sampler = HFSampler(model, tokenizer)
    settings = SamplingSettings(max_new, args.temperature, 1.0, 0)
    records, metrics = timed_eval(
        sampler=sampler,
        tokenizer=tokenizer,
        task=task,
        template=template,
        num_problems=args.problems,
        settings=settings,
        samples=args.samples,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    report = {"model": args.model, "task": args.task, "template": template, **metrics}
    print(json.dumps(report, indent=2))
    if args.out:
        out = {**report, "problems_detail": [r.to_json() for r in records]}
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


def cmd_fields(args: argparse.Namespace) -> int:
    for name, default, doc in describe_fields():
        print(f"{name} = {default}\n    {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keelrl", description="RL post-training for language models on verifiable tasks.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a policy with RL (config file + --set overrides)")
    t.add_argument("config", help="TOML config file (see configs/)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field, e.g. algo.lr=3e-4")
    t.add_argument("--run-dir", help="run directory (default: runs/<config name>)")
    t.add_argument("--resume", choices=["auto", "never"], default="auto", help="auto: continue from the newest valid checkpoint in the run dir")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="held-out accuracy of a model or checkpoint on a task")
    e.add_argument("model", help="hub id, HF directory, checkpoint (RUN/checkpoints/latest), RUN/final, .gguf file, or smollm2")
    e.add_argument("--task", required=True, help="task name (countdown, multiply, code)")
    e.add_argument("--problems", type=int, default=200, help="number of held-out problems")
    e.add_argument("--samples", type=int, default=1, help="samples per problem")
    e.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--max-new-tokens", type=int, default=0, help="completion limit (default: the run's, else 256)")
    e.add_argument("--template", choices=["auto", "base", "chat", "compact"], default=None)
    e.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE", help="task parameter, e.g. max_numbers=3")
    e.add_argument("--batch-size", type=int, default=128)
    e.add_argument("--out", help="write the full result (with per-problem records) to this JSON file")
    e.set_defaults(func=cmd_eval)

    f = sub.add_parser("config-fields", help="print every config field with its default and documentation")
    f.set_defaults(func=cmd_fields)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _user_errors() as err:
        print(f"keelrl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
