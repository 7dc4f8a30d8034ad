"""The one path from problems to scored rollouts, used by training (step/collect.py draws the problems and seeds)
and evaluation (evals/run.py) alike, so what an eval measures is what training samples.

An `Episode` names what to sample: a problem (with its index and group) and its row's seed. `generate`
samples one completion per episode, `score` runs the task's checker over the rollouts (a checker that raises
scores that sample 0 and its error is returned, so one bad sample never ends a run or an eval), and
`run_episodes` does both in batches. For an environment (tasks/env.py) `generate` plays whole multi-turn
episodes (rollout/multiturn.py), which are scored as each ends (the environment's `finish`); `score` then
only returns the errors its environment raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from keelrl.config import EpisodeConfig
from keelrl.rollout import Rollout, Sampler, SamplingSettings, render_prompt
from keelrl.rollout.chat import chat_format
from keelrl.rollout.multiturn import episode_errors, run_multiturn
from keelrl.rollout.types import Episode
from keelrl.tasks import Score, Task, Template
from keelrl.tasks.base import score_safely, unscored
from keelrl.tasks.env import is_environment

# (problems, completions) -> (scores, checker errors): the task's checker, or a pool or drill around it
ScoreFn = Callable[[list[dict[str, Any]], list[str]], tuple[list[Score], list[str]]]

PROMPT_CACHE_LIMIT = 100_000  # problems whose rendered prompt is kept; cleared when full


class Prompter:
    """Problem -> (prompt token ids, assistant prefix), rendered once per problem index. For an environment:
    its chat format (`chat`, from the template and its tools) and its episodes' budgets (`limits`)."""

    def __init__(
        self,
        task: Task,
        tokenizer: PreTrainedTokenizerBase,
        template: Template,
        limits: EpisodeConfig | None = None,
    ) -> None:
        self.task, self.tokenizer, self.template = task, tokenizer, template
        self.cache: dict[int, tuple[list[int], str]] = {}
        self.limits = limits or EpisodeConfig()
        env = is_environment(task)
        self.chat = chat_format(template, tokenizer, getattr(task, "tools", ())) if env else None

    @property
    def multiturn(self) -> bool:
        """Whether the task is an environment (its episodes take turns)."""
        return self.chat is not None

    def shown(self, rollout: Rollout) -> tuple[str, str]:
        """(prompt, completion) as text, as a person judging it (`keelrl judge`) or a reward model reads it: the
        task's user message and the assistant prefix + completion; for an environment the decoded opening
        and the episode's turns, role-tagged (ChatML-style markers, which the judge page splits into turns)."""
        if not self.multiturn:
            return self.task.prompt(rollout.problem, self.template).user, rollout.prefix + rollout.text
        turns = "\n".join(
            f"<|im_start|>{t.get('role', 'assistant')}\n{t.get('content', '')}<|im_end|>"
            for t in rollout.info.get("transcript", [])
        )
        return self.tokenizer.decode(rollout.prompt_ids, skip_special_tokens=True), turns or rollout.text

    def __call__(self, index: int, problem: dict[str, Any]) -> tuple[list[int], str]:
        if index not in self.cache:
            if len(self.cache) > PROMPT_CACHE_LIMIT:
                self.cache.clear()
            prompt = self.task.prompt(problem, self.template)
            ids = render_prompt(self.tokenizer, prompt, self.template)
            self.cache[index] = (ids, prompt.assistant_prefix)
        return self.cache[index]


def generate(
    sampler: Sampler, prompter: Prompter, episodes: Sequence[Episode], settings: SamplingSettings
) -> list[Rollout]:
    """One completion per episode, as unscored rollouts (all tokens trainable: single-turn); for an
    environment, one whole episode each, scored."""
    if prompter.chat is not None:  # an environment
        return run_multiturn(
            sampler, prompter.tokenizer, prompter.chat, prompter.task, episodes, settings, prompter.limits
        )
    prompts = [prompter(e.problem_index, e.problem) for e in episodes]
    longest = prompter.limits.max_prompt_tokens
    fits = [len(ids) <= longest for ids, _ in prompts]
    kept = [(e, ids) for e, (ids, _), ok in zip(episodes, prompts, fits) if ok]
    gens = iter(
        sampler.generate([ids for _, ids in kept], settings, [e.seed for e, _ in kept]) if kept else []
    )
    out = []
    for e, (ids, prefix), ok in zip(episodes, prompts, fits):
        if not ok:
            out.append(_too_long(e, ids, longest, sampler.policy_version, settings))
            continue
        gen = next(gens)
        out.append(
            e.rollout(
                prompt_ids=ids,
                completion_ids=gen.completion_ids,
                sample_logprobs=gen.logprobs,
                trainable=[1] * len(gen.completion_ids),
                finish_reason=gen.finish_reason,
                policy_version=sampler.policy_version,
                sampling=settings,
                text=prompter.tokenizer.decode(gen.completion_ids, skip_special_tokens=True),
                prefix=prefix,
            )
        )
    return out


def _too_long(e: Episode, ids: list[int], longest: int, version: int, settings: SamplingSettings) -> Rollout:
    """The rollout of a prompt over `episode.max_prompt_tokens`: not sampled, no reward (agent_error); it keeps
    the prompt's first `longest` tokens only, so that no later pass over the batch pays for the rest."""
    why = f"the prompt has {len(ids)} tokens, more than episode.max_prompt_tokens = {longest}; it was not sampled"
    s = unscored("agent_error", "prompt_too_long", why)
    return e.rollout(
        prompt_ids=ids[:longest],
        completion_ids=[],
        sample_logprobs=[],
        trainable=[],
        finish_reason="length",
        policy_version=version,
        sampling=settings,
        reward=s.reward,
        correct=s.correct,
        info={**s.info, "prompt_tokens": len(ids)},
        status=s.status,
    )


def score(task: Task, rollouts: Sequence[Rollout], score_fn: ScoreFn | None = None) -> list[str]:
    """Score each rollout's assistant prefix + completion in place; returns the checker errors (no reward).
    An environment's episodes were scored as they ended: returns the errors its `step` or `finish` raised."""
    if is_environment(task):
        return episode_errors(rollouts)
    rollouts = [r for r in rollouts if r.status == "ok"]  # the others were ended unscored (a prompt too long)
    problems = [r.problem for r in rollouts]
    texts = [r.prefix + r.text for r in rollouts]
    scores, errors = (
        (score_fn or (lambda p, t: score_safely(task, p, t)))(problems, texts) if rollouts else ([], [])
    )
    for r, s in zip(rollouts, scores):
        r.reward, r.correct, r.info, r.status = s.reward, s.correct, dict(s.info), s.status
    return errors


def run_episodes(
    sampler: Sampler,
    prompter: Prompter,
    episodes: Sequence[Episode],
    settings: SamplingSettings,
    batch_size: int = 0,
    on_batch: Callable[[list[Rollout]], None] | None = None,
) -> list[Rollout]:
    """`generate` then `score`, `batch_size` episodes at a time (0: all); `on_batch` sees each batch."""
    size = batch_size or max(len(episodes), 1)
    out: list[Rollout] = []
    for start in range(0, len(episodes), size):
        batch = generate(sampler, prompter, episodes[start : start + size], settings)
        score(prompter.task, batch)
        out.extend(batch)
        if on_batch is not None:
            on_batch(batch)
    return out
