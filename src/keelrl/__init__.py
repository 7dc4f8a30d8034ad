"""keelrl: RL post-training for language models on tasks whose answers can be checked.

The Python API: the command line's commands as functions, with one shape, each returning a `Result`.

    train(config, run_dir=None, overrides=None, reward=None)      `keelrl train`
    sft(config, run_dir=None, overrides=None, reward=None)        `keelrl sft` (train.stage = "sft")
    evaluate(config, run_dir=None, overrides=None, reward=None)   `keelrl eval` of model.path on the task

- config: a TOML path, a dict of tables ({"task": {"name": "dataset", ...}}), or a `keelrl.config.Config`;
  for `evaluate` also a run directory (`evaluate(result.run_dir)`: its final policy on its task and eval settings).
  task.params.path and .test may be a `datasets.Dataset` or DatasetDict: it is saved to RUN/data/<key>.
- overrides: dotted keys set on top, as `--set` does: {"train.steps": 3, "model.path": "runs/x/final"}.
- reward: a function, or a list of functions or of {"fn": f, "weight": w, "batched": b} (f may also be a
  "module:function" as in TOML), used instead of task.params.reward (task.name = "dataset";
  tasks/dataset.py says how a reward function is called).
- run_dir: default runs/<config file's name>, or runs/<task name>-<date-time> for a dict or a Config; a run
  directory that holds checkpoints resumes, as with the command line. `evaluate` writes eval.json there
  (what `keelrl compare` reads).
A setting that cannot work raises keelrl's user error (ConfigError, TaskError, ...: the command line's exit 2);
a run that does not finish (a guard stopped it, restarts ran out) raises RunFailed.

Where a run runs: as `keelrl train` does, under the supervisor (a worker process, restarted after a crash or a
hang), or in this process when supervisor.enabled = false. A function defined in a notebook or in `__main__`
(or a lambda, a closure) cannot cross into another process by name, so each reward function is written with
cloudpickle to RUN/rewards/<i>-<name>.pkl, and task.params.reward names those files (config.json shows them;
`keelrl train` can resume the run and `keelrl eval RUN/final` score with them). The worker also gets this
process's sys.path. A function then runs in the worker: what it changes in memory (a list it appends to) stays
there, so write to a file instead. In this process (supervisor.enabled = false, and `evaluate`) the function
given is called itself (one that cannot be pickled then works too, but is not written).
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__version__ = "0.1.0"
__all__ = ["Result", "RunFailed", "evaluate", "sft", "train"]

Reward = Callable[..., Any] | dict[str, Any]


@dataclass(frozen=True)
class Result:
    """run_dir: the run directory. metrics: train/sft, the final step's metrics.jsonl record (with its eval);
    evaluate, the eval summary (accuracy and its interval, pass@k, ...). summary: summary.json (train/sft)."""

    run_dir: Path | None
    metrics: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)


class RunFailed(RuntimeError):
    """A run that ended without finishing: a guard stopped it, or the supervisor gave up on it."""


def train(
    config: Any,
    run_dir: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    reward: Reward | list[Reward] | None = None,
) -> Result:
    """Train as `keelrl train` does (the module docstring says what the arguments are and where it runs)."""
    import unittest.mock

    from keelrl.cli.main import build_parser
    from keelrl.config import config_from_dict
    from keelrl.monitor.run_dir import read_jsonl

    data, run = _resolve(config, run_dir, overrides)
    _save_data(data, run / "data")
    supervised = data.get("supervisor", {}).get("enabled", True)
    if reward is not None:
        _set_reward(data, reward, run / "rewards", required=supervised)
    config_from_dict(data, "the config given to keelrl.train")
    run.mkdir(parents=True, exist_ok=True)
    (run / "api_config.json").write_text(json.dumps(data, indent=1))
    args = build_parser().parse_args(["train", str(run / "api_config.json"), "--run-dir", str(run)])
    path = os.pathsep.join([p or os.getcwd() for p in sys.path] + [os.environ.get("PYTHONPATH", "")])
    with unittest.mock.patch.dict(os.environ, PYTHONPATH=path):  # the worker imports what this process can
        code = int(args.func(args) or 0)
    status = json.loads((run / "status.json").read_text()) if (run / "status.json").exists() else {}
    if code or status.get("state") != "finished":
        why = status.get("reason") or f"exit {code}; its events.jsonl and worker.log say why"
        raise RunFailed(
            f"the run in {run} {status.get('state', 'failed')} at step {status.get('step')}: {why}"
        )
    last: dict[str, Any] = {}
    for record in read_jsonl(run / "metrics.jsonl"):
        last = {**last, **record} if record.get("step") == last.get("step") else record
    return Result(run, last, json.loads((run / "summary.json").read_text()))


def sft(
    config: Any,
    run_dir: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    reward: Reward | list[Reward] | None = None,
) -> Result:
    """Supervised fine-tuning on [data], as `keelrl sft` does: `train` with train.stage = "sft"."""
    return train(config, run_dir, {"train.stage": "sft", **(overrides or {})}, reward)


def evaluate(
    config: Any,
    run_dir: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    reward: Reward | list[Reward] | None = None,
) -> Result:
    """`keelrl eval` of model.path on the task's first eval.problems held-out problems, in this process: greedy
    at eval.temperature 0, else eval.samples samples; completions up to eval.max_new_tokens (0: the rollout's)."""
    from keelrl.cli.eval import eval_model
    from keelrl.cli.main import build_parser
    from keelrl.config import config_from_dict, config_to_dict

    # a run directory: its task, its final policy
    if isinstance(config, (str, Path)) and Path(config).is_dir():
        ran = json.loads((Path(config) / "config.json").read_text())
        config = {
            "model": {"path": str(Path(config) / "final")},
            "task": ran["task"],
            "eval": ran["eval"],
            "rollout": {"max_new_tokens": ran["rollout"]["max_new_tokens"]},
        }
    data, run = _resolve(config, run_dir, overrides)
    _save_data(data, run / "data")
    if reward is not None:
        _set_reward(data, reward, None, required=False)
    cfg = config_from_dict(data, "the config given to keelrl.evaluate")
    e = cfg.eval
    sampled = ["--samples", str(e.samples), "--temperature", str(e.temperature)] if e.temperature > 0 else []
    argv = ["eval", cfg.model.path, "--task", cfg.task.name, "--problems", str(e.problems), *sampled]
    argv += ["--max-new-tokens", str(e.max_new_tokens), "--batch-size", str(e.batch_size)]
    report = eval_model(build_parser().parse_args(argv), cfg.model.path, config_to_dict(cfg))
    if run_dir is not None:
        run.mkdir(parents=True, exist_ok=True)
        (run / "eval.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return Result(run if run_dir is not None else None, report.summary())


def _resolve(config: Any, run_dir: str | Path | None, overrides: dict[str, Any] | None) -> tuple[dict, Path]:
    """(the config's tables with the overrides set, the run directory)."""
    from keelrl.config import Config
    from keelrl.config.load import read_toml, set_key

    if isinstance(config, (str, Path)):
        data, name = read_toml(Path(config)), Path(config).stem
    else:
        # a Config: the fields it was given (what it left at the default stays a default, as in its TOML)
        data = (
            config.model_dump(mode="json", exclude_unset=True)
            if isinstance(config, Config)
            else copy.deepcopy(dict(config))
        )
        name = f"{data.get('task', {}).get('name', 'countdown')}-{time.strftime('%Y%m%d-%H%M%S')}"
    for key, value in (overrides or {}).items():
        set_key(data, key.split("."), value, f"overrides[{key!r}]")
    return data, Path(run_dir) if run_dir is not None else Path("runs") / re.sub(r"[^\w.-]", "_", name)


def _save_data(data: dict[str, Any], folder: Path) -> None:
    """task.params.path / test given as a `datasets.Dataset` (or DatasetDict): written with save_to_disk to
    folder/<key>, which the params then name (what a worker, a resume and `keelrl eval` read)."""
    params = data.get("task", {}).get("params", {})
    for key in ("path", "test"):
        if hasattr(params.get(key), "save_to_disk"):
            params[key].save_to_disk(str(folder / key))
            params[key] = str((folder / key).resolve())


def _set_reward(
    data: dict[str, Any], reward: Reward | list[Reward], folder: Path | None, required: bool
) -> None:
    """task.params.reward := the functions given, each as a .pkl file in `folder` (None: not written), so that
    a worker, `keelrl eval` and a resumed `keelrl train` read them; `required`: a worker must read them."""
    import cloudpickle

    from keelrl.config import ConfigError
    from keelrl.tasks.dataset import IN_PROCESS

    specs = []
    for i, item in enumerate(reward if isinstance(reward, (list, tuple)) else [reward]):
        spec = dict(item) if isinstance(item, dict) else {"fn": item}
        fn = spec.get("fn")
        if isinstance(fn, str):  # "module:function": as in the TOML
            specs.append(spec)
            continue
        if not callable(fn):
            raise ConfigError(f"reward[{i}] is {fn!r}, not a function (or a dict with a function as 'fn')")
        name = re.sub(r"\W", "_", getattr(fn, "__name__", "reward"))
        path = ((folder or Path("rewards")) / f"{i}-{name}.pkl").resolve()
        try:
            blob = cloudpickle.dumps(fn) if folder else b""
        except Exception as err:  # whatever the function holds may refuse to pickle
            if required:
                raise ConfigError(
                    f"reward function {fn!r} cannot be sent to the worker process ({type(err).__name__}: {err}); "
                    "keep what it needs picklable, or train in this process with supervisor.enabled = false"
                ) from None
            blob = b""  # called in this process only: `keelrl eval` of the run then needs reward= again
        if folder and blob:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blob)
        IN_PROCESS[str(path)] = fn
        specs.append({**spec, "fn": str(path)})
    data.setdefault("task", {}).setdefault("params", {})["reward"] = specs
