"""`keelrl judge`: the command over judge/ (a session made or resumed, served until Ctrl-C; or its results)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keelrl.cli.eval import add_model_options
from keelrl.judge.server import serve
from keelrl.judge.session import (
    JudgeError,
    create_session,
    export_preferences,
    open_session,
    render_results,
    results,
    session_file,
)


def cmd_judge(args: argparse.Namespace) -> int:
    """`keelrl judge`: with --results, print (and optionally export) a session's results; otherwise make or
    resume the session and serve the page until Ctrl-C."""
    if args.results:
        if args.models:
            raise JudgeError("--results reads a session; give no models with it")
        res = results(args.results, seed=args.seed)
        if args.export:
            n = export_preferences(args.results, args.export)
            print(f"wrote {n} preference pairs to {args.export}")
        print(json.dumps(res, indent=2) if args.json else render_results(res))
        return 0
    session = Path(args.session or "judge_session")
    if not args.models:  # serve an existing session as it is
        if not args.session:
            raise JudgeError(
                "give two or more models to compare (keelrl judge A B --task NAME), or --session DIR to "
                "serve an existing session, or --results DIR to read one"
            )
        open_session(session)
    elif not args.task:
        raise JudgeError("--task is required to make a session (e.g. --task countdown)")
    else:
        create_session(
            args.models,
            args.task,
            args.problems,
            session,
            seed=args.seed,
            task_params=args.task_param,
            template=args.template,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            device=args.device,
        )
    serve(session, host=args.host, port=args.port)
    print(f"votes are in {session_file(session)}; results: keelrl judge --results {session}")
    return 0


def add_judge_options(p: argparse.ArgumentParser) -> None:
    """`keelrl judge`'s options."""
    p.add_argument("models", nargs="*", metavar="MODEL", help="two or more models or checkpoints to compare")
    p.add_argument("--task", help="task whose held-out problems are judged (countdown, multiply, ...)")
    p.add_argument(
        "--problems", type=int, default=20, help="held-out problems (every model pair meets on each)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    add_model_options(p)
    p.add_argument("--seed", type=int, default=0, help="sampling, side and order seed")
    p.add_argument("--session", help="session directory (default ./judge_session; an existing one resumes)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (0 = any free port)")
    p.add_argument("--results", metavar="SESSION", help="print this session's results instead of serving")
    p.add_argument("--json", action="store_true", help="with --results: print JSON")
    p.add_argument(
        "--export", metavar="PREFS.jsonl", help="with --results: write the a/b votes as preference pairs"
    )
