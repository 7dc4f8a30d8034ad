"""`keelrl judge`: people pick the checkpoint. A blind A/B session over held-out problems, its results and
its votes as preference data.

`create_session` loads each model in turn and generates one completion per held-out problem, every model
with the same sampling settings and seeds (greedy by default), through the episode path `keelrl eval` uses
(`run_episodes`, seed `stable_hash("eval", seed, i, 0)`, so a greedy judge session shows what `keelrl eval`
scored). The task scores each completion; the verdicts are stored but shown only on request. Every two
models meet on every problem; which one is on the left is balanced per model pair (`balanced_sides`) and
the pair order is shuffled with the seed. Models are labelled A, B, C... in the store; their real names live
in the session's meta and appear only in results, which the page shows once the session is finished. Pairs
whose two completions are the same text are never shown: each counts once as a tie, and none is exported. `serve` (judge_server.py) puts the page in front of
people; `results` and `export_preferences` read the votes back. Everything lives in `SESSION/session.sqlite`
(judge_store.py), so a session resumes after any stop.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keelrl.config import ConfigError
from keelrl.judge.store import JudgeStore, Pair, balanced_sides, comparisons, finished, identical_ties

SESSION_FILE = "session.sqlite"
LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class JudgeError(ConfigError):
    """A judge session cannot be made, resumed or read as asked (printed as a user error by the CLI)."""


def session_file(session_dir: str | Path) -> Path:
    return Path(session_dir) / SESSION_FILE


def _check_resume(store: JudgeStore, models: dict[str, str], settings: dict[str, Any]) -> None:
    """Refuse to reuse a session file that was made for other models or other settings."""
    meta = store.meta()
    if "created" not in meta:
        raise JudgeError(
            f"{store.path} exists but its session was never finished being created (interrupted while "
            "generating?); delete it and run again"
        )
    if meta.get("models") != models:
        raise JudgeError(
            f"session {store.path.parent} was made for models {meta.get('models')}, not {models}; give another "
            "--session directory (or the same models in the same order)"
        )
    differ = {k: (meta["settings"].get(k), v) for k, v in settings.items() if meta["settings"].get(k) != v}
    if differ:
        shown = ", ".join(f"{k}: session {old!r} vs now {new!r}" for k, (old, new) in differ.items())
        raise JudgeError(
            f"session {store.path.parent} was made with other settings ({shown}); give another --session "
            "directory or the session's settings"
        )


def generate_completions(
    model_path: str,
    task: Any,
    template_req: str,
    problems: int,
    seed: int,
    temperature: float,
    max_new_tokens: int,
    device: str = "auto",
    batch_size: int = 64,
) -> tuple[list[str], list[str], list[bool]]:
    """(prompt shown per problem, completion per problem, the task's verdict per problem) for one model:
    the first `problems` test problems, one sample each with eval's seeds. The completion holds the assistant
    prefix the scorer sees; an environment's episode is written as role-tagged turns."""
    from keelrl.evals.inputs import load_for_eval
    from keelrl.evals.run import eval_episodes
    from keelrl.rollout import SamplingSettings, make_sampler, resolve_template
    from keelrl.rollout.episodes import Prompter, run_episodes

    model, tokenizer = load_for_eval(model_path, device)
    template = resolve_template(template_req, tokenizer)
    prompter = Prompter(task, tokenizer, template)
    episodes = eval_episodes([task.problem("test", i) for i in range(problems)], 1, seed)
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature)
    rollouts = run_episodes(make_sampler(None, model, tokenizer), prompter, episodes, settings, batch_size)
    rollouts.sort(key=lambda r: r.problem_index)
    shown = [prompter.shown(r) for r in rollouts]  # (prompt, completion) per problem
    del model
    gc.collect()
    return [p for p, _ in shown], [t for _, t in shown], [bool(r.correct) for r in rollouts]


def build_pairs(
    labels: Sequence[str],
    problems: Sequence[dict[str, Any]],
    prompts: Sequence[str],
    texts: dict[str, list[str]],
    verdicts: dict[str, list[bool]],
    seed: int,
) -> list[Pair]:
    """Every two models (in label order) on every problem; sides balanced per model pair; ids in a seeded
    shuffled order (the order a judge sees them)."""
    combos = [(i, a, b) for i in range(len(problems)) for k, a in enumerate(labels) for b in labels[k + 1 :]]
    random.Random(seed).shuffle(combos)
    sides = balanced_sides([(a, b) for _, a, b in combos], seed)
    return [
        Pair(
            pid,
            i,
            dict(problems[i]),
            prompts[i],
            a,
            b,
            texts[a][i],
            texts[b][i],
            verdicts[a][i],
            verdicts[b][i],
            left,
        )
        for pid, ((i, a, b), left) in enumerate(zip(combos, sides))
    ]


def create_session(
    models: Sequence[str],
    task: str,
    problems: int,
    out: str | Path,
    seed: int = 0,
    task_params: Sequence[str] = (),
    template: str | None = None,
    temperature: float = 0.0,
    max_new_tokens: int = 0,
    device: str = "auto",
    batch_size: int = 64,
) -> JudgeStore:
    """Make (or resume) the session in directory `out` comparing `models` on the first `problems` held-out
    problems of `task`. `task_params`: KEY=VALUE strings on top of the first model's run config (as `keelrl
    eval`); `max_new_tokens` 0: the run's, else 256. Returns the session's store."""
    from keelrl.evals.inputs import run_config_near, task_params_for
    from keelrl.tasks import get_task

    models = list(models)
    if len(models) < 2:
        raise JudgeError(f"judging needs at least two models, got {len(models)}")
    if len(models) > len(LABELS):
        raise JudgeError(f"at most {len(LABELS)} models in one session, got {len(models)}")
    if len(set(models)) != len(models):
        raise JudgeError(f"each model once, please: {models} names one twice")
    if problems < 1:
        raise JudgeError(f"--problems must be at least 1, got {problems}")
    if temperature < 0:
        raise JudgeError(f"--temperature must be >= 0, got {temperature}")
    run_cfg = next((c for c in map(run_config_near, models) if c), {})
    params, task_seed, template_req = task_params_for(
        argparse.Namespace(task=task, task_param=list(task_params), template=template), run_cfg
    )
    max_new = max_new_tokens or int(run_cfg.get("rollout", {}).get("max_new_tokens", 256))
    labelled = dict(zip(LABELS, models))
    # what makes two sessions the same session (resuming with other values is refused)
    settings = {
        "task": task,
        "task_params": params,
        "task_seed": task_seed,
        "template": template_req,
        "problems": problems,
        "seed": seed,
        "temperature": temperature,
        "max_new_tokens": max_new,
    }
    store = JudgeStore(session_file(out))
    if store.pairs():
        _check_resume(store, labelled, settings)
        return store
    the_task = get_task(task, task_seed, run_cfg.get("sandbox"), **params)
    texts: dict[str, list[str]] = {}
    verdicts: dict[str, list[bool]] = {}
    prompts: list[str] = []
    for label, path in labelled.items():
        prompts, texts[label], verdicts[label] = generate_completions(
            path, the_task, template_req, problems, seed, temperature, max_new, device, batch_size
        )
    shown = [the_task.problem("test", i) for i in range(problems)]
    store.add_pairs(build_pairs(list(labelled), shown, prompts, texts, verdicts, seed))
    store.set_meta(models=labelled, settings=settings, created=time.time())
    return store


def open_session(session_dir: str | Path) -> JudgeStore:
    """An existing, complete session's store (a clear error otherwise)."""
    path = session_file(session_dir)
    if not path.is_file():
        raise JudgeError(
            f"no judge session at {session_dir} ({SESSION_FILE} missing); start one with `keelrl judge MODEL_A "
            "MODEL_B --task NAME --session DIR`"
        )
    store = JudgeStore(path)
    if "created" not in store.meta():
        raise JudgeError(f"session {session_dir} was never finished being created; delete it and start again")
    return store


def _finite(x: float) -> float | None:
    """NaN (no data) as None: JSON has no NaN, and the page parses this."""
    return None if isinstance(x, float) and math.isnan(x) else x


def results(session_dir: str | Path, resamples: int = 500, seed: int = 0) -> dict[str, Any]:
    """Everything the votes say: per model pair the win rate of the first with a Wilson interval, a
    Bradley-Terry ranking with bootstrap intervals, agreement between judges and with the verifier, and the
    verifier's own accuracy per model. Models appear under their labels with their real names beside. A pair
    with identical texts counts once as a tie in the win rates and the ranking (`identical_pairs` of them)."""
    from keelrl.evals.preferences import bt_intervals, judge_agreement, pair_win_rates, verifier_agreement

    store = open_session(session_dir)
    meta, pairs, votes = store.meta(), store.pairs(), store.votes()
    names: dict[str, str] = meta["models"]
    labels = sorted(names)
    comps = comparisons(pairs, votes)
    by_id = {p.id: p for p in pairs}
    rated = [(a, b, o) for a, b, o, _, _ in comps] + identical_ties(pairs)
    rates = pair_win_rates(rated)
    bt = bt_intervals(rated, labels, resamples=resamples, seed=seed)
    # each completion shown: its model and whether the verifier accepted it
    sides = [side for p in pairs for side in ((p.model_a, p.correct_a), (p.model_b, p.correct_b))]
    shown, verifier = Counter(m for m, _ in sides), Counter(m for m, correct in sides if correct)
    agree_j = judge_agreement([(str(pid), o, judge) for _, _, o, judge, pid in comps])
    # only votes cast without the verdict: a judge who looked at it is no evidence of agreeing with it
    blind = comparisons(pairs, [v for v in votes if not v.verdict_seen])
    agree_v = verifier_agreement(
        [(o, by_id[pid].correct_a, by_id[pid].correct_b) for _, _, o, _, pid in blind]
    )
    return {
        "session": str(session_dir),
        "models": names,
        "settings": meta.get("settings", {}),
        "pairs_total": len(pairs),
        "identical_pairs": sum(p.identical for p in pairs),
        "finished": finished(pairs, votes),
        "votes": len(votes),
        "judges": sorted({v.judge for v in votes}),
        "outcomes": {o: sum(v.outcome == o for v in votes) for o in ("a", "b", "tie", "skip")},
        "votes_with_verdict_seen": sum(v.verdict_seen for v in votes),
        "pairwise": [
            {"a": a, "b": b, "name_a": names[a], "name_b": names[b], **{k: float(v) for k, v in row.items()}}
            for (a, b), row in sorted(rates.items())
        ],
        "ranking": sorted(
            ({"model": m, "name": names[m], **row} for m, row in bt.items()), key=lambda r: r["rank"]
        ),
        "judge_agreement": {k: _finite(v) for k, v in agree_j.items()},
        "verifier_agreement": {k: _finite(v) for k, v in agree_v.items()},
        "verifier_accuracy": {m: verifier[m] / shown[m] if shown[m] else None for m in labels},
    }


def render_results(res: dict[str, Any]) -> str:
    """The results as plain text for the terminal."""
    names = res["models"]
    out = [f"judge session {res['session']}: {res['votes']} votes by {len(res['judges'])} judge(s) over "]
    out[0] += f"{res['pairs_total']} pairs; " + ", ".join(f"{k} {v}" for k, v in res["outcomes"].items())
    out.append(f"  pairs with identical texts, recorded as ties without asking: {res['identical_pairs']}")
    out += [f"  {m} = {name}" for m, name in names.items()]
    out.append("ranking (Bradley-Terry log-strength, 95% bootstrap interval):")
    for r in res["ranking"]:
        acc = res["verifier_accuracy"].get(r["model"])
        verified = "" if acc is None else f"   verifier accuracy {acc:.2f}"
        out.append(
            f"  {r['rank']}. {r['model']}  {r['log_strength']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}]{verified}"
        )
    out.append("pairwise (win rate of the first, ties half, 95% Wilson interval):")
    for p in res["pairwise"]:
        out.append(
            f"  {p['a']} vs {p['b']}: {p['rate']:.2f} [{p['lo']:.2f}, {p['hi']:.2f}]  "
            f"({p['wins']:.0f} wins, {p['ties']:.0f} ties, {p['losses']:.0f} losses)"
        )
    ja, va = res["judge_agreement"], res["verifier_agreement"]
    out.append(
        "judges agree: "
        + ("n/a (no pair judged by two people)" if ja["agreement"] is None else f"{ja['agreement']:.2f}")
        + f" over {ja['judge_pairs']:.0f} judge pairs"
    )
    out.append(
        "people prefer the completion the verifier accepted: "
        + ("n/a" if va["agreement"] is None else f"{va['agreement']:.2f}")
        + f" over {va['votes']:.0f} votes where it accepted exactly one"
        + f" (cast without seeing its verdict; {res['votes_with_verdict_seen']} votes were cast after seeing it)"
    )
    return "\n".join(out)


def export_preferences(session_dir: str | Path, out_jsonl: str | Path) -> int:
    """Write one JSON line per vote that preferred one side (prompt, chosen, rejected, metadata); ties, skips
    and pairs with identical texts (chosen would equal rejected) are left out. Returns the lines written."""
    store = open_session(session_dir)
    meta, by_id = store.meta(), {p.id: p for p in store.pairs()}
    names = meta["models"]
    lines = []
    for v in store.votes():
        p = by_id[v.pair_id]
        if v.outcome not in ("a", "b") or p.identical:
            continue
        win, lose = ("a", "b") if v.outcome == "a" else ("b", "a")
        model = {"a": p.model_a, "b": p.model_b}
        text = {"a": p.text_a, "b": p.text_b}
        correct = {"a": p.correct_a, "b": p.correct_b}
        lines.append(
            {
                "prompt": p.prompt,
                "chosen": text[win],
                "rejected": text[lose],
                "metadata": {
                    "task": meta.get("settings", {}).get("task"),
                    "problem": p.problem,
                    "problem_index": p.problem_index,
                    "pair_id": p.id,
                    "judge": v.judge,
                    "time": v.cast_at,
                    "chosen_model": names[model[win]],
                    "rejected_model": names[model[lose]],
                    "chosen_side": v.winner_side,
                    "verdict_seen": v.verdict_seen,
                    "verifier": {"chosen_correct": correct[win], "rejected_correct": correct[lose]},
                },
            }
        )
    out = Path(out_jsonl)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)
