"""`keelrl eval` and `keelrl compare`: their options, and from those options to an eval report (of a model,
a checkpoint or a saved result) or a paired comparison of two."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from keelrl.config import ConfigError, EpisodeConfig
from keelrl.evals.inputs import load_for_eval, run_config_near, task_params_for


def _parse_ks(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--k expects comma-separated integers such as 1,4,16, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k expects positive integers such as 1,4,16, got {text!r}")
    return ks


def _eval_passes(args: argparse.Namespace) -> tuple[bool, int, float]:
    """(greedy pass?, samples in the sampled pass (0 = none), its temperature) from the eval options."""
    n = args.samples
    if n < 1:
        raise ConfigError(f"--samples must be at least 1, got {n}")
    temperature = args.temperature if args.temperature is not None else (1.0 if n > 1 else 0.0)
    if temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {temperature}")
    if temperature == 0 and n > 1:
        raise ConfigError(
            f"--samples {n} at --temperature 0 would repeat the greedy completion {n} times; give --temperature > 0"
        )
    sampled = n if temperature > 0 else 0
    if args.k and not sampled:
        raise ConfigError("--k needs a sampled pass: give --samples N (and --temperature > 0)")
    if args.no_greedy and not sampled:
        raise ConfigError("--no-greedy leaves nothing to evaluate: also give --samples N --temperature T")
    return not args.no_greedy, sampled, temperature


def _task_and_model(args: argparse.Namespace, model_path: str, run_cfg: dict[str, Any]) -> tuple[Any, ...]:
    """(task, model, tokenizer, template, task params, task seed): the task as the run that `run_cfg` configured
    had it (--task-param and --template on top), and the model to evaluate on it."""
    from keelrl.rollout import resolve_template
    from keelrl.tasks import get_task

    params, task_seed, template_req = task_params_for(args, run_cfg)
    task = get_task(args.task, task_seed, run_cfg.get("sandbox"), **params)
    model, tokenizer = load_for_eval(model_path, args.device)
    return task, model, tokenizer, resolve_template(template_req, tokenizer), params, task_seed


def eval_model(args: argparse.Namespace, model_path: str, run_cfg: dict[str, Any] | None = None) -> Any:
    """One `keelrl eval` of `model_path` with the eval options in `args` -> EvalReport. `run_cfg` (the
    config of the run the model came from) supplies task parameters, template and token limit."""
    from keelrl.evals import evaluate
    from keelrl.monitor.sinks import ProgressBar, make_console
    from keelrl.rollout import make_sampler

    if not args.task:
        raise ConfigError("--task is required (countdown, multiply, code)")
    greedy, samples, temperature = _eval_passes(args)
    if args.problems < 1:
        raise ConfigError(f"--problems must be at least 1, got {args.problems}")
    run_cfg = run_cfg if run_cfg is not None else (run_config_near(model_path) or {})
    task, model, tokenizer, template, params, task_seed = _task_and_model(args, model_path, run_cfg)
    max_new = args.max_new_tokens or run_cfg.get("rollout", {}).get("max_new_tokens", 256)
    total = args.problems * (int(greedy) + samples)
    with ProgressBar(
        make_console(stderr=True), f"eval {model_path}", total, "completions", transient=True
    ) as advance:
        return evaluate(
            make_sampler(None, model, tokenizer),
            tokenizer,
            task,
            template,
            args.problems,
            max_new_tokens=max_new,
            greedy=greedy,
            samples=samples,
            ks=_parse_ks(args.k),
            temperature=temperature,
            seed=args.seed,
            batch_size=args.batch_size,
            meta={
                "model": model_path,
                "task": args.task,
                "task_params": params,
                "task_seed": task_seed,
                "template": template,
            },
            on_progress=advance,
            limits=EpisodeConfig(**run_cfg.get("episode", {})),  # the run's budgets (defaults without one)
        )


def _show(
    args: argparse.Namespace, saved: dict[str, Any], shown: dict[str, Any], tables: Callable[[], Any]
) -> None:
    """Write `saved` to --out, then print `shown`: as JSON with --json, else the tables `tables()` renders."""
    from keelrl.monitor.sinks import make_console

    if args.out:
        Path(args.out).write_text(json.dumps(saved, indent=2) + "\n")
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        make_console(highlight=False).print(*tables())


def _read_json(path: str, what: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {path} does not exist")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{what} {path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} does not hold a JSON object")
    return data


def _report_gates(gates: list[Any], results: dict[str, Any], baseline: dict[str, Any] | None) -> int:
    """Print each gate's outcome; 0 if all pass, 1 if any fails."""
    from keelrl.evals import check_gates

    outcomes = check_gates(gates, results, baseline)
    for o in outcomes:
        print(o.describe(), file=sys.stdout if o.passed else sys.stderr)
    return 0 if all(o.passed for o in outcomes) else 1


def _perplexity_eval(args: argparse.Namespace) -> dict[str, Any]:
    from keelrl.evals import perplexity, reference_perplexity

    source = args.perplexity
    if source == "reference":
        if not args.task:
            raise ConfigError("--perplexity reference needs --task (whose reference solutions to score)")
        task, model, tokenizer, template, _, _ = _task_and_model(
            args, args.model, run_config_near(args.model) or {}
        )
        result = reference_perplexity(model, tokenizer, task, template, args.problems)
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(
                f"--perplexity {source}: no such file (give a text file, a .jsonl file, or 'reference')"
            )
        texts = [ln for ln in path.read_text().splitlines() if ln.strip()]
        if path.suffix == ".jsonl":
            try:
                texts = [str(json.loads(ln)["text"]) for ln in texts]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ConfigError(
                    f'--perplexity {source}: each line must be a JSON object with a "text" field ({err})'
                ) from None
        model, tokenizer = load_for_eval(args.model, args.device)
        result = perplexity(model, tokenizer, texts, source=str(path))
    return {"model": args.model, **result.to_json(seed=args.seed)}


def cmd_eval(args: argparse.Namespace) -> int:
    from keelrl.evals import parse_gate, render_summary

    gates = [parse_gate(g) for g in args.gate]  # malformed gates fail before any work
    baseline = _read_json(args.baseline, "--baseline") if args.baseline else None
    relative = [g.text for g in gates if g.relative]
    if baseline is None and relative:
        raise ConfigError(f"gate {relative[0]!r} uses 'base': give --baseline FILE.json")
    if args.perplexity:
        out = summary = _perplexity_eval(args)
    else:
        out = eval_model(args, args.model).to_json()
        summary = {k: v for k, v in out.items() if k != "records"}
    _show(args, out, summary, lambda: render_summary(summary))
    return _report_gates(gates, summary, baseline)


def _settings_args(
    args: argparse.Namespace, settings: dict[str, Any]
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Eval options and a run config reproducing a saved result's problems and decoding (to compare)."""
    new = argparse.Namespace(**vars(args))
    new.task = settings.get("task", args.task)
    new.template = None
    new.problems = settings.get("problems", args.problems)
    new.no_greedy = not settings.get("greedy", True)
    samples = int(settings.get("samples") or 0)
    new.samples = samples or 1
    new.temperature = settings.get("temperature") if samples else 0.0
    new.k = ",".join(map(str, settings.get("k", []))) or None
    new.max_new_tokens = settings.get("max_new_tokens", args.max_new_tokens)
    new.seed = settings.get("seed", args.seed)
    task = {
        "name": new.task,
        "params": settings.get("task_params", {}),
        "seed": settings.get("task_seed", 0),
        "template": settings.get("template", "auto"),
    }
    return new, {"task": task}


def _is_result_file(path: str) -> bool:
    """A .json argument of `compare` is an eval result (and must exist); anything else is a model."""
    if not path.endswith(".json"):
        return False
    if not Path(path).is_file():
        raise ConfigError(
            f"eval result {path} does not exist; write one with `keelrl eval MODEL --task NAME --out {path}`"
        )
    return True


def cmd_compare(args: argparse.Namespace) -> int:
    from keelrl.evals import EvalReport, compare_results, parse_gate, render_comparison

    gates = [parse_gate(g) for g in args.gate]
    files = [_is_result_file(x) for x in (args.a, args.b)]
    loaded = [
        EvalReport.from_json(_read_json(x, "result"), x) if f else None
        for x, f in zip((args.a, args.b), files)
    ]
    saved = next((r for r in loaded if r is not None), None)
    if saved is not None:
        if not all(files) and args.task and args.task != saved.settings.get("task"):
            raise ConfigError(
                f"--task {args.task} differs from the saved result's task {saved.settings.get('task')!r}"
            )
        eval_args, run_cfg = _settings_args(args, saved.settings)
    else:
        eval_args = args
        # Both are models: one set of task parameters (from whichever came from a run) for both.
        run_cfg = run_config_near(args.a) or run_config_near(args.b) or {}
    reports = [
        r if r is not None else eval_model(eval_args, x, run_cfg) for r, x in zip(loaded, (args.a, args.b))
    ]
    comparison = compare_results(reports[0], reports[1], level=args.level, seed=eval_args.seed)
    comparison = {"a": args.a, "b": args.b, **comparison}
    _show(args, comparison, comparison, lambda: render_comparison(comparison, args.a, args.b))
    return _report_gates(gates, reports[1].summary(), reports[0].summary()) if gates else 0


def add_eval_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `eval` and `compare` (how a model is evaluated)."""
    p.add_argument("--task", help="task name (countdown, multiply, code)")
    p.add_argument("--problems", type=int, default=200, help="number of held-out problems")
    p.add_argument(
        "--samples",
        type=int,
        default=1,
        help="samples per problem for mean@n, pass@k, maj@k (besides the greedy pass)",
    )
    p.add_argument("--k", help="comma-separated k for pass@k and maj@k (default 1,2,4,... up to --samples)")
    p.add_argument(
        "--temperature",
        type=float,
        help="temperature of the sampled pass (default 1.0 when --samples > 1; 0 = greedy only)",
    )
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy pass (accuracy is then mean@n)")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (same seed, same result)")
    add_model_options(p)
    p.add_argument("--batch-size", type=int, default=128, help="completions generated together")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


def add_model_options(p: argparse.ArgumentParser) -> None:
    """Options shared by `eval`, `compare` and `judge`: a model's completion limit, prompts and device."""
    p.add_argument(
        "--max-new-tokens", type=int, default=0, help="completion limit (default: the run's, else 256)"
    )
    p.add_argument(
        "--template",
        choices=["auto", "base", "chat", "compact", "qwen_instruct"],
        help="prompt rendering (default: the run's, else auto)",
    )
    p.add_argument(
        "--task-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task parameter, e.g. max_numbers=3",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the model runs")
