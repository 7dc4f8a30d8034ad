"""Command line: parse, load config, call one function. `python -m keelrl` is the same as `keelrl`."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import sys
from pathlib import Path

from keelrl.cli.eval import add_eval_options, cmd_compare, cmd_eval
from keelrl.config import Config, ConfigError, load_config
from keelrl.config.load import describe_fields
from keelrl.monitor.sinks import say, silence
from keelrl.run.supervisor import ENV_SUPERVISED, supervise
from keelrl.stages import check_run

# Exceptions that mean the user asked for something impossible: printed as one paragraph, exit 2. By name, so
# that catching one imports nothing (its module is loaded: it raised it); tests/unit/test_cli.py checks the names.
USER_ERRORS = (
    "keelrl.config.load.ConfigError", "keelrl.models.load.ModelLoadError", "keelrl.tasks.TaskError",
    "keelrl.run.run.ResumeError", "keelrl.run.checkpoint.CheckpointError", "keelrl.monitor.doctor.DoctorError",
    "keelrl.monitor.run_lock.RunLockedError", "keelrl.monitor.run_dir.RunDirError", "keelrl.stages.sft.data.DataError",
    "keelrl.ladder.kinds.LadderError", "keelrl.ladder.analysis.AnalysisError", "keelrl.sandbox.boxes.BoxError",
)  # fmt: skip


def is_user_error(err: BaseException) -> bool:
    return any(f"{c.__module__}.{c.__qualname__}" in USER_ERRORS for c in type(err).__mro__)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)  # a bad config stops here, before anything starts
    check_run(cfg)  # and what a restart cannot fix, in seconds: task, model.path, a reward model's pairs
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / Path(args.config).stem
    from keelrl.run.distributed import under_torchrun

    if under_torchrun():  # torchrun is the launcher: it restarts the group (--max-restarts), we just train
        return cmd_worker(args)
    torchrun = args.nproc_per_node > 1 or args.torchrun
    if cfg.supervisor.enabled and not args.no_supervisor:
        # With --nproc-per-node N the supervised worker is a torchrun group: a rank that dies (or hangs past
        # distributed.timeout_s) fails the group, and the supervisor restarts all of it from the checkpoint.
        nproc = f"--nproc-per-node={args.nproc_per_node}"
        launcher = (
            ["-m", "torch.distributed.run", "--standalone", nproc, "--max-restarts=0"] if torchrun else []
        )
        argv = [
            sys.executable,
            *launcher,
            "-m",
            "keelrl",
            "worker",
            *([args.config] if args.config else []),  # none: the defaults (keelrl rm train without --config)
            "--run-dir",
            str(run_dir),
            "--resume",
            args.resume,
            *[word for item in args.set for word in ("--set", item)],
        ]
        code = supervise(argv, run_dir, cfg.supervisor, cfg.train.steps, cfg.train.stage)
        _print_outcome(run_dir)
        return code
    if torchrun:
        raise ConfigError(
            "--nproc-per-node and --torchrun need the supervisor (it launches torchrun); drop --no-supervisor, or run "
            "`torchrun --nproc-per-node N -m keelrl train CONFIG` yourself"
        )
    return cmd_worker(args)


def cmd_sft(args: argparse.Namespace) -> int:
    """`keelrl train` with train.stage = "sft" (so the supervisor's workers get it too)."""
    args.set = ["train.stage=sft", *args.set]
    return cmd_train(args)


RM_HELD_OUT = 0.1  # `keelrl rm train`: the share of pairs held out when the config holds none out


def cmd_rm(args: argparse.Namespace) -> int:
    """`keelrl rm train PREFS --model M`: `keelrl train` with train.stage = "rm" on those pairs."""
    model = [f"model.path={args.model}"] if args.model else []
    d = load_config(args.config, args.set).data  # what the user's config and --set say (as an RL config)
    held_out = [] if d.eval_path or d.eval_fraction > 0 else [f"data.eval_fraction={RM_HELD_OUT}"]
    args.set = ["train.stage=rm", f"data.path={args.prefs}", *model, *held_out, *args.set]
    args.run_dir = args.run_dir or str(Path("runs") / f"rm-{Path(args.prefs).stem}")
    return cmd_train(args)


def cmd_rft(args: argparse.Namespace) -> int:
    from keelrl.stages.sft.rft import collect_correct

    overrides = [*args.set, *([f"model.path={args.model}"] if args.model else [])]
    cfg = load_config(args.config, overrides)
    counts = collect_correct(cfg, args.out, args.problems, args.samples, args.per_problem)
    print(json.dumps(counts))
    print(f"next: keelrl sft {args.config} --set data.path={args.out}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Train in this process (what the supervisor runs, and `keelrl train --no-supervisor`)."""
    from keelrl.loop.trainer import train
    from keelrl.run.run import RunStop

    cfg = load_config(args.config, args.set)
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / Path(args.config).stem
    supervised = os.environ.get(ENV_SUPERVISED) == "1"  # then the supervisor says how it ended
    try:
        train(cfg, run_dir, resume=args.resume)
    except RunStop as err:
        if not supervised:
            print(f"keelrl: {err}", file=sys.stderr)
        return err.exit_code
    if int(os.environ.get("RANK", 0)) == 0 and not supervised:
        _print_outcome(run_dir)
    return 0


def _print_outcome(run_dir: Path) -> None:
    """The last line: the final eval of a finished run (stdout), else its state and why it stopped (stderr)."""
    summary_file = run_dir / "summary.json"
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").exists() else {}
    if status.get("state") == "finished" and summary_file.exists():
        summary = json.loads(summary_file.read_text())
        acc = summary.get("final_eval", {}).get("accuracy")
        shown = f"{acc:.3f}" if isinstance(acc, (int, float)) else "n/a"
        what = "held-out pair accuracy" if summary.get("stage") == "rm" else "final eval accuracy"
        say(f"done: {summary.get('steps')} steps, {what} {shown}, run dir {run_dir}")
    elif status:
        at = f" at step {status['step']}" if status.get("step") is not None else ""
        why = f": {status['reason']}" if status.get("state") == "stopped" and status.get("reason") else ""
        say(f"run {status.get('state')}{at} (run dir {run_dir}){why}", err=True)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.recipe != "rl" and args.engine != "hf":
        raise ConfigError(f"--recipe {args.recipe} samples with the hf engine; drop --engine")
    if args.recipe == "search":  # Stream of Search: pretrain on search traces, then RL (recipes/search.py)
        from keelrl.recipes.search import run_search_demo

        run_search_demo(
            seed=args.seed,
            minutes=args.minutes or 12.0,
            out=Path(args.out or "runs/demo_search"),
            numbers=args.numbers,
            threads=args.threads,
        )
    elif args.recipe == "smollm2":  # a real pretrained model: SFT on search traces, then GRPO
        from keelrl.recipes.smollm2 import run_smollm2

        run_smollm2(seed=args.seed, out=args.out, threads=args.threads, quick=args.quick, task=args.task)
    else:
        from keelrl.recipes.demo import run_demo

        run_demo(
            seed=args.seed,
            minutes=args.minutes or 12.0,
            out=Path(args.out or "runs/demo"),
            threads=args.threads,
            engine=args.engine,
        )
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from keelrl.monitor.doctor import run_doctor

    return run_doctor(args.run_dir, as_json=args.json)


def cmd_report(args: argparse.Namespace) -> int:
    from keelrl.monitor.report import run_report

    path = run_report([args.run_dir, *args.compare], args.out)
    print(f"report: {path}")
    return 0


def cmd_fields(args: argparse.Namespace) -> int:
    for name, default, doc in describe_fields(Config):
        print(f"{name} = {default}\n    {doc}")
    return 0


def _add_train_options(t: argparse.ArgumentParser, positional_config: bool = True) -> None:
    if positional_config:
        t.add_argument("config", help="TOML config file (see configs/)")
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. algo.lr=3e-4",
    )
    t.add_argument(
        "--run-dir",
        help="run directory (default: runs/<config name>)"
        if positional_config
        else "default: runs/rm-<prefs name>",
    )
    t.add_argument(
        "--resume",
        choices=["auto", "never"],
        default="auto",
        help="auto: continue from the newest valid checkpoint in the run dir",
    )
    t.add_argument(
        "--no-supervisor", action="store_true", help="train in this process (no automatic restarts)"
    )
    t.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        help="train with N processes on this machine (torchrun under keelrl's supervisor; see [distributed])",
    )
    t.add_argument(
        "--torchrun",
        action="store_true",
        help="launch under torchrun even for one process: a process group of one rank, so the NCCL and FSDP2 "
        "paths run on one GPU as on many",
    )


def worker_parser() -> argparse.ArgumentParser:
    """`keelrl worker ...`: what the supervisor runs (not a user's command, so not in --help)."""
    w = argparse.ArgumentParser(prog="keelrl worker")
    w.add_argument("config", nargs="?")
    w.add_argument("--set", action="append", default=[])
    w.add_argument("--run-dir")
    w.add_argument("--resume", choices=["auto", "never"], default="auto")
    w.set_defaults(func=cmd_worker)
    return w


def _add_result_options(p: argparse.ArgumentParser, out_help: str, gate_help: str) -> None:
    """`eval` and `compare`: where the result is written, and the gates it must pass."""
    p.add_argument("--out", help=out_help)
    p.add_argument("--gate", action="append", default=[], metavar="EXPR", help=gate_help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="keelrl", description="RL post-training for language models on verifiable tasks."
    )
    p.add_argument("--version", action="version", version=f"keelrl {importlib.metadata.version('keelrl')}")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a policy with RL (config file + --set overrides)")
    _add_train_options(t)
    t.set_defaults(func=cmd_train)
    s = sub.add_parser(
        "sft",
        help="supervised fine-tuning on [data] (data.path: JSONL/Parquet/Arrow, or a run dir's correct rollouts)",
    )
    _add_train_options(s)
    s.set_defaults(func=cmd_sft)
    rf = sub.add_parser(
        "rft",
        help="rejection sampling: sample the task's training problems, keep the correct completions (JSONL)",
    )
    rf.add_argument("config", help="TOML config file: the task, model and rollout settings to sample with")
    rf.add_argument(
        "--out", required=True, help="JSONL file to write ({problem, completion, reward} per line)"
    )
    rf.add_argument("--model", help="sample this model instead of model.path (e.g. RUN/final)")
    rf.add_argument(
        "--problems", type=int, default=1000, help="training problems to sample (default %(default)s)"
    )
    rf.add_argument("--samples", type=int, default=8, help="completions per problem (default %(default)s)")
    rf.add_argument(
        "--per-problem",
        type=int,
        default=2,
        help="distinct correct completions kept per problem (default %(default)s)",
    )
    rf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    rf.set_defaults(func=cmd_rft)

    rm = sub.add_parser("rm", help="reward models: `keelrl rm train PREFS.jsonl --model M`")
    rm_sub = rm.add_subparsers(dest="rm_command", required=True)
    rt = rm_sub.add_parser(
        "train",
        help="fit a Bradley-Terry reward model (model.path's decoder + a scalar head) to preference pairs",
    )
    rt.add_argument(
        "prefs", help="preference pairs ({prompt, chosen, rejected} per line; keelrl judge --export)"
    )
    rt.add_argument(
        "--model", help="the decoder to start from (model.path): hub id, directory, RUN/final, tiny"
    )
    rt.add_argument("--config", help="TOML config for everything else ([data], [algo] lr, [train], ...)")
    _add_train_options(rt, positional_config=False)
    rt.set_defaults(func=cmd_rm)

    e = sub.add_parser(
        "eval",
        help="held-out accuracy, pass@k, maj@k with 95%% intervals (or perplexity) of a model or checkpoint",
    )
    e.add_argument(
        "model",
        help="hub id, HF directory, checkpoint (RUN/checkpoints/latest), RUN/final, .gguf file, or smollm2",
    )
    add_eval_options(e)
    _add_result_options(
        e,
        "write the full result (with per-problem records, for keelrl compare) to this JSON file",
        "exit 1 unless EXPR holds, e.g. 'accuracy>=0.45', 'pass@4.lo>0.6', 'accuracy>=base-0.01' (repeatable)",
    )
    e.add_argument("--baseline", metavar="FILE.json", help="eval result that 'base' in --gate refers to")
    e.add_argument(
        "--perplexity",
        metavar="SOURCE",
        help="instead of generating, measure perplexity on SOURCE: 'reference' (the task's reference solutions) or a text file (one text per line; .jsonl: the \"text\" field)",
    )
    e.set_defaults(func=cmd_eval)

    c = sub.add_parser(
        "compare",
        help="paired comparison of two models or eval results on the same problems: better / worse / indistinguishable per metric",
    )
    c.add_argument(
        "a", metavar="A", help="baseline: an eval result (.json from keelrl eval --out) or a model/checkpoint"
    )
    c.add_argument(
        "b",
        metavar="B",
        help="candidate: an eval result or a model/checkpoint (evaluated like A: same problems and seed)",
    )
    add_eval_options(c)
    c.add_argument("--level", type=float, default=0.95, help="confidence level of the paired intervals")
    _add_result_options(
        c,
        "write the comparison to this JSON file",
        "exit 1 unless EXPR holds for B, with 'base' = A, e.g. 'accuracy>=base-0.01' (repeatable)",
    )
    c.set_defaults(func=cmd_compare)

    m = sub.add_parser(
        "demo", help="the whole lifecycle on a laptop CPU: pretrain a tiny model, RL it, eval before/after"
    )
    m.add_argument(
        "--recipe",
        choices=["rl", "search", "smollm2"],
        default="rl",
        help="rl: two-number Countdown, pretrain then RL; search: Stream of Search on 3-number Countdown "
        "(pretrain on search traces, then RL; behaviour statistics before and after); smollm2: "
        "SmolLM2-135M-Instruct, SFT on search traces then GRPO (make smollm2)",
    )
    m.add_argument(
        "--numbers", type=int, choices=[3, 4], default=3, help="--recipe search: numbers per problem"
    )
    m.add_argument("--seed", type=int, default=0, help="seed of every stage")
    m.add_argument(
        "--minutes", type=float, help="scale the work (step counts) to about this many minutes (default 12)"
    )
    m.add_argument(
        "--engine", choices=["hf", "vllm"], default="hf", help="what samples during RL (rollout.engine)"
    )
    m.add_argument(
        "--out", help="output directory (default runs/demo, runs/demo_search, runs/smollm2[_multiply])"
    )
    m.add_argument(
        "--quick", action="store_true", help="--recipe smollm2: a smoke run of every stage (minutes)"
    )
    m.add_argument(
        "--task",
        choices=["countdown", "multiply"],
        default="countdown",
        help="--recipe smollm2: the task (multiply: 2-digit by 1- and 2-digit Multiplication)",
    )
    m.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's default)")
    m.set_defaults(func=cmd_demo)

    d = sub.add_parser(
        "doctor", help="diagnose a run: findings most severe first (exit 0 healthy, 1 warnings, 2 critical)"
    )
    d.add_argument("run_dir", help="run directory (or a metrics.jsonl file)")
    d.add_argument("--json", action="store_true", help="print the diagnosis as one JSON object")
    d.set_defaults(func=cmd_doctor)

    r = sub.add_parser(
        "report", help="write one self-contained HTML report of a run (interactive plots, findings, rollouts)"
    )
    r.add_argument("run_dir", help="run directory")
    r.add_argument("-o", "--out", help="output HTML file (default: RUN_DIR/report.html)")
    r.add_argument(
        "--compare", nargs="+", default=[], metavar="RUN_DIR2", help="overlay these runs, list config diffs"
    )
    r.set_defaults(func=cmd_report)

    j = sub.add_parser(
        "judge",
        help="blind A/B page: people compare models' completions side by side (--results: rankings, export)",
    )
    from keelrl.cli.judge import add_judge_options, cmd_judge

    add_judge_options(j)
    j.set_defaults(func=cmd_judge)

    lad = sub.add_parser(
        "ladder",
        help="scaling ladder: a grid of short runs, ScaleRL / Chinchilla fits, a predicted target run checked",
    )
    from keelrl.ladder.runner import add_ladder_options, cmd_ladder

    add_ladder_options(lad)
    lad.set_defaults(func=cmd_ladder)

    from keelrl.tasks.check import add_tasks_options

    add_tasks_options(sub.add_parser("tasks", help="agentic task sets: `tasks check DIR...`, base images"))

    f = sub.add_parser("config-fields", help="print every config field with its default and documentation")
    f.set_defaults(func=cmd_fields)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    worker = argv[:1] == ["worker"]  # what the supervisor runs: its errors read as the command's own
    try:
        args = worker_parser().parse_args(argv[1:]) if worker else build_parser().parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) shows here, not at exit
        return code
    except BrokenPipeError:  # `keelrl doctor RUN | head`: stop quietly, with a SIGPIPE's status, as cat does
        return silence(sys.stdout) or 128 + signal.SIGPIPE
    except Exception as err:
        if not is_user_error(err):
            raise
        print(f"keelrl{'' if worker else ' ' + argv[0]}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
