"""Checks of a whole `Config` that no single field can make (`Config` runs them on validation; `setup` runs
the batch arithmetic again once the world size is known)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from keelrl.config_load import ConfigError

if TYPE_CHECKING:
    from keelrl.config import Config


def check_packages(cfg: Config) -> None:
    """Raise ValueError naming the setting and the `pip install` that fixes it when `cfg` needs an optional
    package that is not installed (checked on load: a run never starts only to crash on an import)."""
    c = cfg
    ray_pool = "scorer" if c.distributed.scorer == "ray" else "sampler"
    needs = {  # import name -> (the setting that needs it, needed?, keelrl's extra that installs it)
        "wandb": ("log.wandb = true", c.log.wandb, "wandb"),
        "mlflow": ("log.mlflow = true", c.log.mlflow, "mlflow"),
        "vllm": ("rollout.engine = 'vllm'", c.rollout.engine == "vllm", "vllm"),
        "peft": (f"model.lora.rank = {c.model.lora.rank}", c.model.lora.rank > 0, "peft"),
        "ray": (f"distributed.{ray_pool} = 'ray'", "ray" in (c.distributed.scorer, c.distributed.sampler), "ray"),
        "gguf": (f"model.path = {c.model.path!r}", c.model.path.endswith(".gguf") or c.model.path == "smollm2", "gguf"),
        "reasoning_gym": (f"task.name = {c.task.name!r}", c.task.name.startswith("reasoning_gym:"), "envs"),
    }  # fmt: skip
    for module, (setting, needed, extra) in needs.items():
        if needed and importlib.util.find_spec(module) is None:
            raise ValueError(
                f"{setting} needs the {module} package, which is not installed here: {pip_install(extra, module)} "
                f"(or pip install 'keelrl[{extra}]'), or change {setting.split(' = ')[0]}"
            )


def pip_install(extra: str, fallback: str) -> str:
    """The `pip install` of keelrl's `extra` (its packages and versions as pyproject.toml lists them)."""
    try:
        reqs = importlib.metadata.requires("keelrl") or []
    except importlib.metadata.PackageNotFoundError:
        reqs = []
    wanted = [r.split(";")[0].strip() for r in reqs if r.endswith(f'extra == "{extra}"')]
    return "pip install " + " ".join(f"'{r}'" for r in wanted or [fallback])


def local_path(path: str) -> bool:
    """Whether a model name can only be a local path: it starts with '.', '/' or '~', ends in .gguf, or has
    more slashes than a hub id (org/name)."""
    return path.startswith((".", "/", "~")) or path.endswith(".gguf") or path.count("/") > 1


def check_inputs(cfg: Config) -> None:
    """What a run names must be there before anything starts (`keelrl train` runs this before the supervisor, a
    ladder for every point): the task builds with task.params, model.path and reward.model exist when they are
    local paths, and a reward model's preference pairs can train and judge it. Raises a user error (exit 2)."""
    from keelrl.tasks import TaskError, get_task

    task = get_task(cfg.task.name, cfg.task.seed, cfg.sandbox, **cfg.task.params)
    for split in ("train", "test"):  # a split with nothing in it fails here, not at the first eval
        try:
            task.problem(split, 0)
        except Exception as err:  # whatever the task raises, drawing it again would raise it again
            raise TaskError(f"task.name = {cfg.task.name!r} has no {split} problem: {err}") from None
    for setting, path in (("model.path", cfg.model.path), ("reward.model", cfg.reward.model)):
        if path and local_path(path) and not Path(path).expanduser().exists():
            raise ConfigError(
                f"{setting} = {path!r} does not exist. Give an HF model directory, a keelrl checkpoint (RUN/final, "
                "RUN/checkpoints/latest), a .gguf file, a hub id (org/name), 'smollm2' or 'tiny'."
            )
    if cfg.train.stage == "rm":
        from keelrl.sft.data import read_pairs

        read_pairs(cfg.data, cfg.task.seed)


def check_batch_arithmetic(cfg: Config, world_size: int) -> None:
    """Raise ValueError spelling out the arithmetic when batch settings do not fit together."""
    r, a, t = cfg.rollout, cfg.algo, cfg.train
    if t.stage in ("sft", "rm"):
        return check_supervised_stage(cfg, world_size)
    if r.batch_size % r.group_size:
        raise ValueError(
            f"rollout.batch_size={r.batch_size} is not divisible by rollout.group_size={r.group_size} "
            f"({r.batch_size} / {r.group_size} = {r.batch_size / r.group_size:g}); every prompt needs a full group. "
            f"Use a multiple of {r.group_size}, e.g. {max(1, r.batch_size // r.group_size) * r.group_size}."
        )
    prompts = r.batch_size // r.group_size
    if prompts % world_size:
        raise ValueError(
            f"rollout.batch_size / rollout.group_size = {prompts} prompts per step cannot be split evenly over "
            f"{world_size} ranks ({prompts} / {world_size} = {prompts / world_size:g})."
        )
    if r.batch_size % a.minibatches:
        raise ValueError(
            f"rollout.batch_size={r.batch_size} is not divisible by algo.minibatches={a.minibatches} "
            f"({r.batch_size} / {a.minibatches} = {r.batch_size / a.minibatches:g})."
        )
    per_rank_minibatch = r.batch_size // a.minibatches // world_size
    if per_rank_minibatch % t.micro_batch_size:
        raise ValueError(
            f"the mini-batch of rollout.batch_size / algo.minibatches{' / world_size' if world_size > 1 else ''} = "
            f"{per_rank_minibatch} sequences is not divisible by train.micro_batch_size={t.micro_batch_size} "
            f"({per_rank_minibatch} / {t.micro_batch_size} = {per_rank_minibatch / t.micro_batch_size:g}). "
            f"Pick a micro_batch_size that divides {per_rank_minibatch}."
        )


def check_engine(cfg: Config) -> None:
    """Raise ValueError when `cfg` (a Config) asks the vLLM engine for something it does not do."""
    r, v = cfg.rollout, cfg.vllm
    if r.engine != "vllm":
        return
    if r.top_p < 1.0 or r.top_k > 0:
        raise ValueError(
            f"rollout.engine = 'vllm' with rollout.top_p = {r.top_p}, top_k = {r.top_k}: vLLM's log-probs are then "
            "renormalised over the kept tokens, while the trainer uses the whole tempered distribution, so the PPO "
            "ratio would be biased. Use top_p = 1.0 and top_k = 0 with the vLLM engine."
        )
    if v.dtype != "float32" and cfg.algo.old_logprobs == "sampler":
        raise ValueError(
            f"vllm.dtype = '{v.dtype}' with algo.old_logprobs = 'sampler': a {v.dtype} engine's log-probs differ from "
            "the trainer's by ~0.03 nats per token, too much for the PPO ratio's denominator. Set "
            "algo.old_logprobs = 'recompute' (or vllm.dtype = 'float32')."
        )


def check_off_policy(cfg: Config) -> None:
    """Raise ValueError when asynchronous sampling (`rollout.max_staleness`) or an off-policy correction is asked
    for where it cannot work."""
    r, a = cfg.rollout, cfg.algo
    if r.max_staleness == 0:
        if "correction" in a.model_fields_set and a.correction != "off" and a.old_logprobs == "sampler":
            raise ValueError(
                f"algo.correction = '{a.correction}' has nothing to correct: with algo.old_logprobs = 'sampler' and "
                "rollout.max_staleness = 0 the sampler's log-probs are the proximal policy's (rho = 1). Set "
                "algo.old_logprobs = 'recompute' to correct for a sampler whose numerics differ."
            )
        return
    k = r.max_staleness
    if cfg.curriculum.dynamic_sampling:
        raise ValueError(
            f"rollout.max_staleness = {k} with curriculum.dynamic_sampling: refills are sampled during the step, by "
            "the current policy, so the batch would mix versions. Turn one of them off."
        )
    if r.engine == "vllm":
        raise ValueError(
            f"rollout.max_staleness = {k} with rollout.engine = 'vllm' is not supported yet: the asynchronous sampler "
            "is a transformers process of its own (or, with distributed.sampler = 'ray', transformers actors). Use "
            "rollout.engine = 'hf'."
        )


def check_supervised_stage(cfg: Config, world_size: int) -> None:
    """train.stage = "sft" or "rm": data to train on, examples that split over the ranks, and no RL-only
    machinery that the stage would silently ignore."""
    d, stage = cfg.data, cfg.train.stage
    if not d.path:
        raise ValueError(
            f"train.stage = '{stage}' needs data.path (a JSONL/Parquet/Arrow file, or --set data.path=FILE)"
        )
    if stage == "rm" and not d.eval_path and d.eval_fraction == 0:
        raise ValueError(
            "a reward model is judged by its held-out pair accuracy: set data.eval_fraction (e.g. 0.1) or "
            "data.eval_path (held-out pairs)"
        )
    if d.batch_size % world_size:
        raise ValueError(
            f"data.batch_size={d.batch_size} examples cannot be split evenly over {world_size} ranks "
            f"({d.batch_size} / {world_size} = {d.batch_size / world_size:g})."
        )
    refused = {
        "rollout.max_staleness": cfg.rollout.max_staleness != 0,
        "algo.kl_coef": cfg.algo.kl_coef > 0,
        "algo.advantage = 'gae'": cfg.algo.advantage == "gae",
        "reward.model": bool(cfg.reward.model),
    }
    if stage == "rm":  # a reward model samples nothing
        refused.update({"rollout.engine = 'vllm'": cfg.rollout.engine == "vllm", "data.packing": d.packing})
    if bad := [k for k, on in refused.items() if on]:
        raise ValueError(
            f"train.stage = '{stage}' does not use {', '.join(bad)}; remove them from the {stage.upper()} config"
        )


def check_selfplay(cfg: Config) -> None:
    """train.stage = "selfplay": a task with a proposal checker, synchronous sampling, and room in the solver's
    batch for every proposal a step can make (so each new one is solved, and paid, in its step)."""
    if cfg.train.stage != "selfplay":
        return
    from keelrl.selfplay.proposers import PROPOSERS

    if cfg.task.name not in PROPOSERS:
        raise ValueError(
            f"train.stage = 'selfplay' needs a task whose proposals keelrl can check ({', '.join(PROPOSERS)}); "
            f"task.name = {cfg.task.name!r} has none yet"
        )
    unsupported = {
        "rollout.max_staleness": (cfg.rollout.max_staleness, 0),
        "reward.model": (cfg.reward.model, ""),
        "curriculum.kind": (cfg.curriculum.kind, "sequential"),
        "curriculum.dynamic_sampling": (cfg.curriculum.dynamic_sampling, False),
    }
    for key, (value, plain) in unsupported.items():
        if value != plain:
            raise ValueError(
                f"train.stage = 'selfplay' does not combine with {key} = {value!r} yet (the proposals' buffer is "
                f"its problem source and the task's checker its reward); set {key} = {plain!r}"
            )
    if cfg.selfplay.policies == "two":
        refused = {
            "rollout.engine = 'vllm'": cfg.rollout.engine != "hf",
            "model.lora": cfg.model.lora.rank > 0,
            "algo.advantage = 'gae'": cfg.algo.advantage == "gae",
        }
        if bad := [k for k, on in refused.items() if on]:
            raise ValueError(
                f"selfplay.policies = 'two' does not combine with {', '.join(bad)} yet: the proposer is a second "
                "in-process policy on the hf engine, trained whole by a group estimator with its own optimizer; "
                "drop them or use selfplay.policies = 'one'"
            )
    proposals = cfg.selfplay.proposer_prompts * cfg.rollout.group_size
    if proposals > cfg.prompts_per_step:
        raise ValueError(
            f"selfplay.proposer_prompts x rollout.group_size = {proposals} proposals per step, but the solver "
            f"takes rollout.batch_size / group_size = {cfg.prompts_per_step} problems: lower proposer_prompts or "
            "raise rollout.batch_size, so that every new proposal is solved (and paid) in its step"
        )
    if cfg.selfplay.buffer_capacity < proposals:
        raise ValueError(
            f"selfplay.buffer_capacity = {cfg.selfplay.buffer_capacity} is below the {proposals} proposals of one "
            "step: a new problem could leave the buffer before it is solved"
        )
