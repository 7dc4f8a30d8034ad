"""`train.stage = "selfplay"`: one step of propose-then-solve (Absolute Zero, arXiv 2505.03335), on a task with
a proposer (`proposers.PROPOSERS`: Countdown, code), with one policy in both roles or two (`selfplay.policies`,
roles.py).

1. Propose: `selfplay.proposer_prompts` prompts, each sampled rollout.group_size times. A prompt varies by its
   cue, drawn per prompt (Countdown: the first number of the problem line; code: an example problem from the
   buffer).
2. Check: the task's rules (the proposer's `check`; Countdown: well-formed, in range, not a held-out number
   set, solvable; code: the reference passes its tests in the sandbox, twice alike). Valid problems enter the
   buffer, deduplicated by the proposer's key.
3. Solve: prompts_per_step problems, this step's new proposals first, then the buffer's (in order), each
   sampled group_size times and scored by the task's checker, as RL scores its problems.
4. Pay: the solver by correctness (the task's reward); a new valid proposal by its learnability,
   1 - s for a solve rate 0 < s < 1, else 0 (`algo.selfplay`); an invalid or duplicate proposal 0.
5. Update: one policy: both roles' rollouts in one batch, group by group (every group has group_size rows, so
   the advantage estimator's groups are each role's own), through the RL update. Two policies: the solver's
   rollouts update the policy, the proposer's the proposer (metrics `proposer/*`), each through the RL update.

The buffer is the run's problem source (`source.py`): it is saved and resumed with the step's state. Seeds
derive from (train.seed, step, rollbacks), so a resumed run proposes and solves what it would have.
Metrics: `selfplay/*` (valid, new and duplicate shares, distinct share of the valid ones, refusal reasons,
proposer reward, learnable share, the new problems' solve rate, buffer size); `accuracy` and `reward/mean` are the solver's.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from keelrl.algo.selfplay import learnability_reward
from keelrl.core.seeds import stable_hash
from keelrl.rollout import Rollout
from keelrl.rollout.episodes import Episode, Prompter, generate, score
from keelrl.rollout.prompts import render_prompt
from keelrl.run.run import Run
from keelrl.run.state import TrainState
from keelrl.stages.selfplay.proposers import PROPOSERS
from keelrl.stages.selfplay.roles import proposer_view
from keelrl.stages.selfplay.source import SelfPlaySource
from keelrl.step.collect import close_step, rollout_metrics
from keelrl.step.update import end_of_step, rl_update
from keelrl.tasks.base import Prompt


class ProposerPrompter:
    """Proposer prompts as token ids; the proposal's start is returned as the assistant prefix, so a rollout's
    prefix + text is the whole proposal."""

    chat = None  # single-turn

    def __init__(self, run: Run) -> None:
        self.run, self.tokenizer, self.limits = run, run.tokenizer, run.prompter.limits

    def __call__(self, index: int, problem: dict[str, Any]) -> tuple[list[int], str]:
        template, run = self.run.prompter.template, self.run
        user, start = PROPOSERS[run.task.name].prompt(run.task, problem, template, run.cfg.selfplay.proposal)
        if template == "compact":
            # the user text (if any) on its own line, then the start (Countdown: a corpus line's first number)
            text = f"{user}\n{start}" if user else start
            return self.tokenizer(text, add_special_tokens=False)["input_ids"], start
        return render_prompt(self.tokenizer, Prompt("", user, start), template), start


def _seeds(run: Run, state: TrainState) -> Callable[..., int]:
    """This step's seeds: a function of (train.seed, step, rollbacks) and what is drawn, as the RL step's."""
    return functools.partial(
        stable_hash, "selfplay", run.cfg.train.seed, state.step, state.guards.get("rollbacks", 0)
    )


def propose(run: Run, state: TrainState, source: SelfPlaySource) -> tuple[list[Rollout], list[str]]:
    """Sample and check this step's proposals; valid new ones enter the buffer. Returns the proposer
    rollouts (reward 0 so far) and the new problems' keys, in order."""
    cfg, G, proposer = run.cfg, run.cfg.rollout.group_size, PROPOSERS[run.task.name]
    seed = _seeds(run, state)
    cues = [
        proposer.cue(run.task, seed("cue", g), source.buffer) for g in range(cfg.selfplay.proposer_prompts)
    ]
    episodes = [
        Episode(g, {"role": "propose", **cue}, g, seed("propose", g * G + k))
        for g, cue in enumerate(cues)
        for k in range(G)
    ]
    budget = cfg.selfplay.proposer_max_new_tokens or run.settings.max_new_tokens
    settings = dataclasses.replace(run.settings, max_new_tokens=budget)
    rollouts = generate(run.sampler, ProposerPrompter(run), episodes, settings)
    new_keys = []
    for r in rollouts:
        checked = proposer.check(run.task, r.prefix + r.text, cfg.selfplay.proposal)
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
    seed, problem_key = _seeds(run, state), PROPOSERS[run.task.name].key
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


def selfplay_metrics(
    proposals: list[Rollout], rates: dict[str, float], buffer_size: int, refusals: tuple[str, ...]
) -> dict[str, float]:
    n = len(proposals)
    reasons = Counter(r.info["reason"] for r in proposals)
    new = [r for r in proposals if r.info["new"]]
    new_rates = [rates[r.info["key"]] for r in new if r.info["key"] in rates]
    valid_keys = [r.info["key"] for r in proposals if r.info["key"]]
    out = {
        "selfplay/valid_frac": (reasons["valid"] + reasons["duplicate"]) / n,
        "selfplay/new_frac": len(new) / n,
        "selfplay/duplicate_frac": reasons["duplicate"] / n,
        "selfplay/proposer_reward": sum(r.reward for r in proposals) / n,
        "selfplay/learnable_frac": sum(0.0 < s < 1.0 for s in new_rates) / n,
        "selfplay/buffer_size": float(buffer_size),
    }
    if valid_keys:  # diversity: different problems among this step's valid proposals (1: all differ)
        out["selfplay/distinct_frac"] = len(set(valid_keys)) / len(valid_keys)
    if new_rates:
        out["selfplay/new_solve_rate"] = sum(new_rates) / len(new_rates)
    return out | {f"selfplay/refused/{reason}": reasons[reason] / n for reason in refusals}


def selfplay_step(run: Run, state: TrainState) -> dict[str, float]:
    """One self-play step (see the module docstring). Returns the step's metrics."""
    source = run.source
    assert isinstance(source, SelfPlaySource)  # setup builds it for this stage
    t0 = time.perf_counter()
    run.heartbeat.beat(phase="sample")
    proposer_run, proposer_state = proposer_view(run, state)  # (run, state) itself with one policy
    proposals, new_keys = propose(proposer_run, proposer_state, source)
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
    refusals = PROPOSERS[run.task.name].reasons
    metrics.update(selfplay_metrics(proposals, rates, len(source.buffer.entries), refusals))
    if state.proposer is None:  # one policy in both roles: one update over both roles' groups
        metrics.update(rl_update(run, state, rollouts))
    else:  # two policies: each is updated on its own role's rollouts (roles.py)
        # no problem to solve yet (an empty buffer, no valid proposal): the schedule still follows the step
        metrics.update(rl_update(run, state, solutions) if solutions else end_of_step(run, state))
        proposer_metrics = rl_update(proposer_run, proposer_state, proposals)
        metrics.update({f"{proposer_run.metric_prefix}{k}": v for k, v in proposer_metrics.items()})
        state.proposer.version = proposer_state.policy_version
    t3 = time.perf_counter()
    return close_step(run, state, rollouts, metrics, (t0, t1, t1, t1, t3))
