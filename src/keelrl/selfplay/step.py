"""`train.stage = "selfplay"`: one step of propose-then-solve with one policy in both roles (Absolute Zero,
arXiv 2505.03335), on a task with a proposal checker (Countdown).

1. Propose: `selfplay.proposer_prompts` prompts, each sampled rollout.group_size times. A prompt is the start
   of a problem line, a first number drawn from the task's range (a chat template adds the instruction).
2. Check: the task's rules (`check_proposal`: well-formed, in range, not a held-out number set, solvable).
   Valid problems enter the buffer, deduplicated.
3. Solve: prompts_per_step problems, this step's new proposals first, then the buffer's (in order), each
   sampled group_size times and scored by the task's checker, as RL scores its problems.
4. Pay: the solver by correctness (the task's reward); a new valid proposal by its learnability,
   1 - s for a solve rate 0 < s < 1, else 0 (`algo.selfplay`); an invalid or duplicate proposal 0.
5. Update: both roles' rollouts in one batch, group by group (every group has group_size rows, so the
   advantage estimator's groups are each role's own), through the RL update.

The buffer is the run's problem source (`source.py`): it is saved and resumed with the step's state. Seeds
derive from (train.seed, step, rollbacks), so a resumed run proposes and solves what it would have.
Metrics: `selfplay/*` (valid, new and duplicate shares, refusal reasons, proposer reward, learnable share,
the new problems' solve rate, buffer size); `accuracy` and `reward/mean` are the solver's.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from keelrl.algo.selfplay import learnability_reward
from keelrl.collect import close_step, rollout_metrics
from keelrl.rollout import Rollout
from keelrl.rollout.episodes import Episode, Prompter, generate, score
from keelrl.rollout.prompts import render_prompt
from keelrl.run import Run
from keelrl.seeds import stable_hash
from keelrl.selfplay.countdown import check_proposal, problem_key, proposer_prompt
from keelrl.selfplay.source import SelfPlaySource
from keelrl.state import TrainState
from keelrl.tasks.base import Prompt
from keelrl.update import rl_update


class ProposerPrompter:
    """Proposer prompts as token ids; the line's start is returned as the assistant prefix, so a rollout's
    prefix + text is the whole proposed line."""

    chat = None  # single-turn

    def __init__(self, run: Run) -> None:
        self.run, self.tokenizer = run, run.tokenizer

    def __call__(self, index: int, problem: dict[str, Any]) -> tuple[list[int], str]:
        template = self.run.prompter.template
        user, start = proposer_prompt(self.run.task, int(problem["first"]), template)
        if template == "compact":  # the bare start of a corpus line, no newline before it
            return self.tokenizer(start, add_special_tokens=False)["input_ids"], start
        return render_prompt(self.tokenizer, Prompt("", user, start), template), start


def _seeds(run: Run, state: TrainState) -> Callable[..., int]:
    """This step's seeds: a function of (train.seed, step, rollbacks) and what is drawn, as the RL step's."""
    return functools.partial(
        stable_hash, "selfplay", run.cfg.train.seed, state.step, state.guards.get("rollbacks", 0)
    )


def propose(run: Run, state: TrainState, source: SelfPlaySource) -> tuple[list[Rollout], list[str]]:
    """Sample and check this step's proposals; valid new ones enter the buffer. Returns the proposer
    rollouts (reward 0 so far) and the new problems' keys, in order."""
    cfg, G = run.cfg, run.cfg.rollout.group_size
    seed = _seeds(run, state)
    p = run.task.params
    firsts = [
        p.min_number + seed("first", g) % (p.max_number - p.min_number + 1)
        for g in range(cfg.selfplay.proposer_prompts)
    ]
    episodes = [
        Episode(g, {"role": "propose", "first": first}, g, seed("propose", g * G + k))
        for g, first in enumerate(firsts)
        for k in range(G)
    ]
    rollouts = generate(run.sampler, ProposerPrompter(run), episodes, run.settings)
    new_keys = []
    for r in rollouts:
        checked = check_proposal(run.task, r.prefix + r.text)
        new = checked.problem is not None and source.buffer.add(checked.key, checked.problem, state.step + 1)
        reason = "duplicate" if checked.problem is not None and not new else checked.reason
        r.reward, r.correct = 0.0, False
        line = (r.prefix + r.text).split("\n", 1)[0][:80]
        r.info = {"role": "propose", "proposal": line, "reason": reason, "key": checked.key, "new": new}
        if new:
            new_keys.append(checked.key)
    return rollouts, new_keys


def solve(
    run: Run, state: TrainState, source: SelfPlaySource, new_keys: list[str]
) -> tuple[list[Rollout], dict[str, float], int]:
    """The solver's rollouts on this step's problems (new proposals first, then the buffer's), scored;
    each problem's solve rate (recorded in the buffer too), and how many checkers raised."""
    cfg, G, n = run.cfg, run.cfg.rollout.group_size, run.cfg.prompts_per_step
    seed = _seeds(run, state)
    problems = [dict(source.buffer.entries[k].problem) for k in new_keys[:n]]
    taken = set(new_keys[:n])
    for _, problem in source.next_problems(n):
        if len(problems) < n and problem_key(problem) not in taken:
            problems.append(problem)
            taken.add(problem_key(problem))
    start = cfg.selfplay.proposer_prompts  # the solver's groups follow the proposer's
    episodes = [
        Episode(i, problem, start + i, seed("solve", i * G + k))
        for i, problem in enumerate(problems)
        for k in range(G)
    ]
    # a Prompter of this step: its cache is keyed by problem index, and these problems are new every step
    rollouts = generate(
        run.sampler, Prompter(run.task, run.tokenizer, run.prompter.template), episodes, run.settings
    )
    errors = score(run.task, rollouts)
    rates: dict[str, float] = {}
    for i, problem in enumerate(problems):
        solved = sum(r.correct for r in rollouts[i * G : (i + 1) * G])
        key = problem_key(problem)
        rates[key] = solved / G
        if key in source.buffer.entries:
            source.buffer.record(key, G, solved)
    for r in rollouts:
        r.info["role"] = "solve"
    return rollouts, rates, len(errors)


def selfplay_metrics(proposals: list[Rollout], rates: dict[str, float], buffer_size: int) -> dict[str, float]:
    n = len(proposals)
    reasons = Counter(r.info["reason"] for r in proposals)
    new = [r for r in proposals if r.info["new"]]
    new_rates = [rates[r.info["key"]] for r in new if r.info["key"] in rates]
    out = {
        "selfplay/valid_frac": (reasons["valid"] + reasons["duplicate"]) / n,
        "selfplay/new_frac": len(new) / n,
        "selfplay/duplicate_frac": reasons["duplicate"] / n,
        "selfplay/proposer_reward": sum(r.reward for r in proposals) / n,
        "selfplay/learnable_frac": sum(0.0 < s < 1.0 for s in new_rates) / n,
        "selfplay/buffer_size": float(buffer_size),
    }
    if new_rates:
        out["selfplay/new_solve_rate"] = sum(new_rates) / len(new_rates)
    for reason in (
        "malformed",
        "unsolvable",
        "held_out",
        "count_out_of_range",
        "number_out_of_range",
        "target_out_of_range",
    ):
        out[f"selfplay/refused/{reason}"] = reasons[reason] / n
    return out


def selfplay_step(run: Run, state: TrainState) -> dict[str, float]:
    """One self-play step (see the module docstring). Returns the step's metrics."""
    source = run.source
    assert isinstance(source, SelfPlaySource)  # setup builds it for this stage
    t0 = time.perf_counter()
    run.heartbeat.beat(phase="sample")
    proposals, new_keys = propose(run, state, source)
    solutions, rates, errors = solve(run, state, source, new_keys)
    t1 = time.perf_counter()
    for r in proposals:
        if r.info["new"] and r.info["key"] in rates:
            r.info["solve_rate"] = rates[r.info["key"]]
            r.reward = learnability_reward(rates[r.info["key"]])
    rollouts = proposals + solutions
    run.heartbeat.beat(phase="update")
    metrics = rollout_metrics(run, solutions) if solutions else {}
    metrics["tokens/generated"] = float(sum(len(r.completion_ids) for r in rollouts))
    metrics["reward/errors"] = float(errors)
    metrics.update(selfplay_metrics(proposals, rates, len(source.buffer.entries)))
    metrics.update(rl_update(run, state, rollouts))
    t3 = time.perf_counter()
    return close_step(run, state, rollouts, metrics, (t0, t1, t1, t1, t3))
