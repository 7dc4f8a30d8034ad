"""RL from a data set and a reward function: `task.name = "dataset"`, everything else in `task.params`.

    [task]
    name = "dataset"
    params = { path = "data/train.jsonl", reward = "my_rewards:exact_match" }

Data (`path`): a .jsonl / .json / .parquet / .csv / .arrow file (.gz too) or a glob of them
("data/train-*.parquet"), a folder of such files (splits named by file, as `datasets.load_dataset` names them),
a folder written by `save_to_disk`, or a hub data set id (`subset` picks its configuration), read with
`datasets.load_dataset`: offline it reads the local cache (HF_DATASETS_OFFLINE=1 skips the network). CSV cells
are read as text, as written ("007" stays "007", an empty cell is ""); a JSON column of mixed types comes as
datasets' Json feature (the text "1" comes back as the number 1). Training rows come from split `split`.
Held out (`test`): a split name of the same data, another file, or a fraction of the rows (by a hash of the
prompt, so equal prompts stay on one side and adding rows moves no other; with few rows, at least one distinct
prompt on each side); by default the data's "test" split, else its "validation" split, else 10% of the rows.

Prompt (`prompt_field`, default "prompt"): text, or chat messages ([{"role", "content"}, ...] ending with a
user turn; a leading system message is the system turn). Rendered by `task.template` like every task.

Reward (`reward`): "package.module:function", "path/to/file.py:function" (relative to the working directory),
or a list of them or of `{ fn = "...", weight = 1.0 }`. Each function is called in one of three ways (CALLS),
chosen by its parameters' names, so functions written for TRL or veRL run unchanged:
- `fn(completion, **row)`: the completion text, then every field of the row (native types, as `datasets`
  reads them) as keyword arguments (only those the function names, when it has no **kwargs);
- TRL's, for a function with a `completions`, `prompts` or `completion_ids` parameter (or marked
  `batched = true`, or `fn.batched = True`): once per scoring batch, `fn(prompts=[...], completions=[...],
  **columns)`, each column a list (every field but the prompt's), the completions as text, or as
  `[{"role": "assistant", "content": text}]` when the prompts are chat messages; it returns one value per
  completion (keelrl passes no `completion_ids`, `trainer_state`: a function that needs them is refused);
- veRL's, for a function with a `solution_str` parameter: `fn(data_source=, solution_str=, ground_truth=,
  extra_info=)`, from the row's `data_source`, `reward_model.ground_truth` (else `answer_field`) and
  `extra_info` columns (veRL's parquet layout).
A value is a number (bool counts as 0/1; a dict gives its "score", as veRL's may), or None: the function
does not apply to that sample (TRL's convention). The sample's reward is the weighted sum of the values given;
`correct` (accuracy) is the first function's value >= `correct_at` (the first checks the answer, later ones
shape; accuracy is never format credit). An `async def` function (or one returning an awaitable) is awaited,
a batch's calls concurrently. A function that cannot be called with the data's columns is a TaskError when
the task is built; one that raises or returns something else (NaN, a string, a list), or a sample that no
function scores, gives that sample no reward (status `verifier_error`, its error in `info["error"]`, counted
in `episode/verifier_errors`; the `unscored_episodes` guard stops a run where most samples error). Each
function's value: `info["rewards"]`, and its batch mean `reward/fn/<name>` in metrics.jsonl.

Problems are `{"split", "row", "prompt"}`: row `row` of the data the split came from (the training data for a
held-out fraction), and its prompt (for people reading traces). Train problem `index` is row `index % n` of a
per-epoch shuffle (seeded by task.seed); test problem `index` is the `index`-th held-out row in data order. So a
problem is a function of (split, index, seed) and the data: ranks shard by index and a resumed run draws the
same rows, as long as the data is not changed under it (keelrl does not hash the data).
Buckets (`difficulty_field`): the column's values, easiest first by `difficulty_order` or sorted (numbers by
value): what `curriculum.kind = "adaptive"` climbs and eval breakdowns group by.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import glob
import importlib
import inspect
import json
import math
import numbers
import pickle
import runpy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keelrl.core.seeds import stable_hash
from keelrl.tasks import TaskError
from keelrl.tasks.base import (
    Prompt,
    Score,
    Split,
    TaskParams,
    Template,
    check_bucket,
    in_test_split,
    unscored,
)

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
REWARD_HELP = (
    "give task.params.reward as 'package.module:function' (importable: installed or on PYTHONPATH), "
    "'path/to/file.py:function', or a list of { fn = ..., weight = ... }"
)
# keelrl.train: a reward's .pkl path -> the function it was written from (called itself in this process)
IN_PROCESS: dict[str, Callable[..., Any]] = {}


def load_splits(path: str, subset: str = "") -> Any:
    """The splits of a data file (or glob), folder, `save_to_disk` folder or hub id, as a `DatasetDict`."""
    import datasets

    datasets.disable_progress_bars()
    p = Path(path).expanduser()
    kind = FORMATS.get(Path(p.name.removesuffix(".gz")).suffix)
    files = sorted(glob.glob(str(p))) if kind else []
    on_disk = (p / "dataset_dict.json").exists() or (p / "state.json").exists()
    if not (on_disk or files or p.is_dir()) and (p.exists() or kind or path.startswith((".", "/", "~"))):
        raise TaskError(
            f"{path} {'is not a data file' if p.exists() else 'does not exist'}; data is "
            f"{', '.join(FORMATS)} (.gz too), a glob of them, a folder, or a hub id"
        )
    try:
        if on_disk:
            ds = datasets.load_from_disk(str(p))
        elif files and kind == "csv":
            ds = datasets.load_dataset(kind, data_files=files, **_csv_as_text(files[0]))
        elif files:
            ds = datasets.load_dataset(kind, data_files=files)
        elif p.is_dir():  # a folder of CSV files is read as text too
            builder = datasets.load_dataset_builder(str(p), subset or None)
            csv = (
                [f for fs in (builder.config.data_files or {}).values() for f in fs]
                if builder.name == "csv"
                else []
            )
            ds = datasets.load_dataset(str(p), subset or None, **(_csv_as_text(csv[0]) if csv else {}))
        else:  # a hub id: the local cache when offline
            ds = datasets.load_dataset(path, subset or None)
    except (OSError, ValueError, ImportError, datasets.exceptions.DatasetsError) as err:
        why = f"{type(err).__name__}: {str(err)[:400]}" + (f" ({err.__cause__})" if err.__cause__ else "")
        hub = "; a hub id needs the network, or a copy in the local cache (HF_DATASETS_OFFLINE=1)"
        raise TaskError(f"cannot load data set {path!r}: {why}{'' if p.exists() else hub}") from None
    return ds if isinstance(ds, datasets.DatasetDict) else datasets.DatasetDict(train=ds)


def _csv_as_text(first: str) -> dict[str, Any]:
    """`load_dataset` arguments reading every column of CSV files as text, as written ("007" stays "007", an empty
    cell is ""), the columns from the header of `first` (a .gz too)."""
    import datasets
    import pandas

    columns = pandas.read_csv(first, nrows=0).columns
    return {
        "features": datasets.Features(dict.fromkeys(columns, datasets.Value("string"))),
        "keep_default_na": False,
    }


# ---------------------------------------------------------------------------------------------- reward functions


class RewardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    fn: str = Field(description="'package.module:function', 'file.py:function', or a .pkl (keelrl.train).")
    weight: float = Field(1.0, description="Weight of this function in the sample's reward (a weighted sum).")
    batched: bool = Field(
        False,
        description="Called once per batch with lists, as TRL calls them (so is one with `completions`).",
    )


@dataclass(frozen=True)
class Reward:
    name: str
    fn: Callable[..., Any]
    weight: float
    style: str  # how it is called: a key of CALLS
    signature: inspect.Signature | None  # None: a callable without one (some builtins); called as is


def _row_calls(completions: list[str], rows: list[dict], params: DatasetParams) -> list[tuple[tuple, dict]]:
    return [((c,), row) for c, row in zip(completions, rows)]


def _trl_calls(completions: list[str], rows: list[dict], params: DatasetParams) -> list[tuple[tuple, dict]]:
    prompts = [row[params.prompt_field] for row in rows]
    shown = [
        c if isinstance(p, str) else [{"role": "assistant", "content": c}]
        for p, c in zip(prompts, completions)
    ]
    columns = {k: [row[k] for row in rows] for k in rows[0] if k != params.prompt_field}
    return [((), {"prompts": prompts, "completions": shown, **columns})]


def _verl_calls(completions: list[str], rows: list[dict], params: DatasetParams) -> list[tuple[tuple, dict]]:
    def truth(row: dict) -> Any:
        given = row.get("reward_model")
        return given.get("ground_truth") if isinstance(given, dict) else row.get(params.answer_field)

    return [
        ((), {"data_source": row.get("data_source"), "solution_str": c, "ground_truth": truth(row),
              "extra_info": row.get("extra_info")})
        for c, row in zip(completions, rows)
    ]  # fmt: skip


TRL_NAMES = {"prompts", "completions", "completion_ids"}  # a parameter named so: called as TRL calls it
# A calling convention: (how it reads, the calls for a batch); "trl" is one call for the batch, others one each.
CALLS: dict[str, tuple[str, Callable[..., list[tuple[tuple, dict]]]]] = {
    "row": ("fn(completion, **row)", _row_calls),
    "trl": ("TRL's fn(prompts=[...], completions=[...], **columns), without completion_ids", _trl_calls),
    "verl": ("veRL's fn(data_source=, solution_str=, ground_truth=, extra_info=)", _verl_calls),
}


def load_function(spec: str) -> Callable[..., Any]:
    """A reward function from its spec (see the module docstring); ValueError saying how to fix it."""
    if spec in IN_PROCESS:
        return IN_PROCESS[spec]
    module, _, attr = spec.partition(":")
    try:
        if spec.endswith(".pkl"):
            with open(spec, "rb") as f:
                fn = pickle.load(f)
        elif not attr:
            raise ValueError("expected 'module:function'")
        elif module.endswith(".py"):
            if not Path(module).is_file():
                raise FileNotFoundError(f"no file {module} (relative to {Path.cwd()})")
            fn = _file_globals(str(Path(module).resolve()))[attr]
        else:
            fn = functools.reduce(getattr, attr.split("."), importlib.import_module(module))
    except Exception as err:  # the user's module may raise anything while it is imported
        raise ValueError(
            f"cannot load reward function {spec!r} ({type(err).__name__}: {err}); {REWARD_HELP}"
        ) from None
    if not callable(fn):
        raise ValueError(f"reward function {spec!r} is a {type(fn).__name__}, not a function; {REWARD_HELP}")
    return fn


@functools.cache
def _file_globals(path: str) -> dict[str, Any]:
    """A reward file's names, the file run once per process."""
    return runpy.run_path(path)


def load_rewards(specs: list[RewardSpec]) -> list[Reward]:
    if not specs or not all(s.fn for s in specs):
        raise ValueError(f"no reward function: {REWARD_HELP} (or pass reward= to keelrl.train)")
    out: list[Reward] = []
    for s in specs:
        fn = load_function(s.fn)
        name = getattr(fn, "__name__", None) or getattr(
            getattr(fn, "func", fn), "__name__", type(fn).__name__
        )
        try:
            signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a callable without a signature: called as is
            signature = None
        names = signature.parameters if signature else {}
        trl = s.batched or getattr(fn, "batched", False) is True or bool(TRL_NAMES & set(names))
        style = "trl" if trl else "verl" if "solution_str" in names else "row"
        taken = {r.name for r in out}
        out.append(
            Reward(name if name not in taken else f"{name}_{len(out)}", fn, s.weight, style, signature)
        )
    return out


def _kwargs(r: Reward, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `r` takes: all of them when it has **kwargs (or no signature)."""
    params = r.signature.parameters if r.signature else None
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def check_call(r: Reward, row: dict[str, Any], params: DatasetParams) -> None:
    """TaskError when `r` cannot be called as its convention calls it with the data's columns."""
    if r.signature is None:
        return
    shape, calls = CALLS[r.style]
    args, kwargs = calls([""], [row], params)[0]
    try:
        r.signature.bind(*args, **_kwargs(r, kwargs))
    except TypeError as err:
        raise TaskError(
            f"reward function {r.name}{r.signature} cannot be called as {shape} with the data's columns "
            f"({', '.join(row)}): {err}. Name the columns it needs as its parameters, or add **row"
        ) from None


def _run(awaitables: list[Any]) -> list[Any]:
    """Await all (concurrently), exceptions as values, in a thread of their own (a notebook's loop may run here)."""

    async def gather() -> list[Any]:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, gather()).result()


def _value(name: str, value: Any) -> float | str | None:
    """The value as a float, None (the function does not apply), or the error: a sentence."""
    if isinstance(value, BaseException):
        return f"reward function {name} raised {type(value).__name__}: {value}"[:300]
    value = value.get("score", value) if isinstance(value, dict) else value  # veRL's {"score": ..., ...}
    if value is None:
        return None
    if isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0:  # numpy and torch scalars too
        with contextlib.suppress(TypeError, ValueError):
            if math.isfinite(number := float(value)):
                return number
    hint = " (one that scores a whole batch takes `completions`, or is marked batched)"
    hint *= isinstance(value, list)
    return f"reward function {name} returned {str(value)[:60]!r} ({type(value).__name__}), not a finite number{hint}"


def call_reward(
    r: Reward, completions: list[str], rows: list[dict[str, Any]], params: DatasetParams
) -> list[float | str | None]:
    """One function's values for a batch (see the module docstring): each a float, None, or an error sentence."""
    outs: list[Any] = []
    for args, kwargs in CALLS[r.style][1](completions, rows, params):
        try:
            outs.append(r.fn(*args, **_kwargs(r, kwargs)))
        except Exception as err:  # the user's function: any error is that call's
            outs.append(err)
    waiting = [i for i, o in enumerate(outs) if inspect.isawaitable(o)]
    for i, value in zip(waiting, _run([outs[i] for i in waiting]) if waiting else []):
        outs[i] = value
    if r.style != "trl":
        return [_value(r.name, v) for v in outs]
    out, n = outs[0], len(rows)
    if isinstance(out, BaseException):
        hint = " (the prompts are text, so completions are text: completion[0]['content'] needs chat prompts)"
        text = isinstance(rows[0][params.prompt_field], str) and isinstance(
            out, (TypeError, KeyError, IndexError)
        )
        return [f"{_value(r.name, out)}{hint * text}"] * n
    values = list(out) if isinstance(out, (list, tuple)) or getattr(out, "ndim", None) == 1 else None
    if values is None or len(values) != n:
        got = f"{len(values)} values" if values is not None else f"a {type(out).__name__}"
        return [f"batched reward function {r.name} returned {got} for {n} completions"] * n
    return [_value(r.name, v) for v in values]


# ---------------------------------------------------------------------------------------------------- the task


class DatasetParams(TaskParams):
    path: str = Field(description="A data file (or glob), a folder, a save_to_disk folder or a hub id.")
    subset: str = Field("", description="The hub data set's configuration (load_dataset's `name`).")
    split: str = Field("train", description="The split trained on.")
    test: Annotated[float, Field(gt=0, lt=1)] | str | None = Field(
        None,
        description="Held-out rows: a split name, a data file, or a fraction (0-1, by a hash of the prompt); "
        "default: the data's 'test' split, else its 'validation' split, else 0.1.",
    )
    prompt_field: str = Field("prompt", description="The column holding the prompt: text or chat messages.")
    answer_field: str = Field(
        "answer",
        description="The column holding the reference answer (optional; veRL functions' ground_truth when the "
        "data has no reward_model column; `keelrl eval --perplexity`).",
    )
    difficulty_field: str = Field("", description="The column whose values are the difficulty buckets.")
    difficulty_order: list[str] = Field(default_factory=list, description="The buckets easiest first.")
    reward: list[RewardSpec] = Field(
        default_factory=list,
        description="'module:function', 'file.py:function', or a list of { fn, weight, batched }.",
    )
    correct_at: float = Field(
        1.0,
        description="A sample counts as correct (accuracy) when the first reward function's value >= this.",
    )

    @field_validator("reward", mode="before")
    @classmethod
    def _one_function(cls, value: Any) -> Any:
        return [
            {"fn": v} if isinstance(v, str) else v
            for v in ([value] if isinstance(value, (str, dict)) else value)
        ]

    @model_validator(mode="after")
    def _rewards_load(self) -> DatasetParams:
        load_rewards(self.reward)
        return self


def check_params(params: dict[str, Any]) -> None:
    """Config-time check (without the data): ValueError naming task.params.<field> and the fix."""
    try:
        DatasetParams(**params)
    except ValidationError as err:
        raise ValueError(
            "; ".join(
                f"task.params.{'.'.join(map(str, e['loc'])) or 'reward'}: {e['msg'].removeprefix('Value error, ')}"
                for e in err.errors()
            )
        ) from None


def held_out(keys: list[str], seed: int, fraction: float) -> set[str]:
    """The keys held out, each by its hash (`in_test_split`); with few distinct keys, at least one on each side."""
    unique = set(keys)
    held = {k for k in unique if in_test_split(k, seed, fraction)}
    if len(unique) > 1 and len(held) in (0, len(unique)):
        rank = sorted(unique, key=lambda k: stable_hash("split", seed, k))
        held = held - {rank[-1]} if held else {rank[0]}
    return held


def _order_key(value: str) -> tuple[bool, float, str]:
    try:
        return False, float(value), value
    except ValueError:
        return True, 0.0, value


class DatasetTask:
    """Rows of a data set, scored by reward functions; see the module docstring."""

    def __init__(self, seed: int = 0, **params: Any) -> None:
        self.seed, self.name = seed, "dataset"
        self.params = p = DatasetParams(**params)
        self.rewards = load_rewards(p.reward)
        splits = load_splits(p.path, p.subset)
        if p.split not in splits:
            raise TaskError(f"task.params.split = {p.split!r}: {p.path} has splits {', '.join(splits)}")
        test = p.test if p.test is not None else next((s for s in ("test", "validation") if s in splits), 0.1)
        train = self._checked(splits[p.split], f"split {p.split!r} of {p.path}")
        self.tables, self.rows = {"train": train, "test": train}, {"train": list(range(len(train)))}
        if isinstance(test, float):
            keys = [json.dumps(x, default=str) for x in train[p.prompt_field]]
            held = held_out(keys, seed, test)
            self.rows = {
                s: [i for i, k in enumerate(keys) if (k in held) == (s == "test")] for s in ("train", "test")
            }
        else:
            if test in splits:
                table, where = splits[test], f"split {test!r} of {p.path}"
            elif Path(test).expanduser().exists() or glob.has_magic(test):
                other = load_splits(test)
                table, where = other[next(iter(other))], test
            else:
                raise TaskError(
                    f"task.params.test = {test!r} is not a file, nor a split of {p.path} ({', '.join(splits)})"
                )
            self.tables["test"], self.rows["test"] = self._checked(table, where), list(range(len(table)))
        for split, rows in self.rows.items():
            if not rows:
                raise TaskError(
                    f"the {split} split is empty ({len(train)} training rows in {p.path}, task.params.test = "
                    f"{test!r}); give more rows, or task.params.test as a file (the training file itself "
                    "evaluates on training rows)"
                )
        for split, rows in self.rows.items():  # a held-out file may have other columns
            first = self.row({"split": split, "row": rows[0]})
            for r in self.rewards:
                check_call(r, first, p)
        field = p.difficulty_field
        self.levels = {s: [str(v) for v in list(self.tables[s][field])] if field else None for s in self.rows}
        found = sorted(
            {self.levels["train"][i] for i in self.rows["train"]} if field else {"all"}, key=_order_key
        )
        unknown = sorted(set(found) - set(p.difficulty_order)) if p.difficulty_order else []
        if unknown:
            raise TaskError(f"task.params.difficulty_order lacks {', '.join(unknown)} (found in {field!r})")
        self.ladder = [b for b in p.difficulty_order if b in found] or found

    def _checked(self, table: Any, where: str) -> Any:
        """`table` if the fields the params name are its columns and its prompts are text or messages."""
        p, columns = self.params, list(table.column_names)
        named = [("prompt_field", p.prompt_field), ("difficulty_field", p.difficulty_field)]
        named += [("answer_field", p.answer_field)] if "answer_field" in p.model_fields_set else []
        for key, col in named:
            if col and col not in columns:
                raise TaskError(
                    f"task.params.{key} = {col!r} is not a column of {where}; its columns: {', '.join(columns)}"
                )
        if "completion" in columns:
            raise TaskError(
                f"{where} has a column 'completion', which would clash with fn(completion, **row); remove or "
                "rename it (e.g. Dataset.rename_column, then save_to_disk)"
            )
        column = table.with_format("arrow")[p.prompt_field]
        if column.null_count or (len(table) and not isinstance(table[0][p.prompt_field], (str, list))):
            first = column.to_pylist().index(None) if column.null_count else 0
            raise TaskError(
                f"task.params.prompt_field = {p.prompt_field!r} holds {type(table[first][p.prompt_field]).__name__} "
                f"in row {first} of {where} ({column.null_count} rows hold None); a prompt is text or chat messages: "
                "drop such rows (Dataset.filter) or name another column"
            )
        return table

    def size(self, split: Split) -> int:
        return len(self.rows[split])

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return self._pick(split, "", index)

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        check_bucket(self, bucket)
        return self._pick(split, bucket, index)

    def buckets(self) -> list[str]:
        return list(self.ladder)

    def difficulty(self, problem: dict[str, Any]) -> str:
        levels = self.levels[problem["split"]]
        return "all" if levels is None else levels[problem["row"]]

    @functools.lru_cache(maxsize=16)  # noqa: B019 (one task per run: the cache lives as long as the task)
    def _order(self, split: str, bucket: str, epoch: int) -> np.ndarray:
        levels = self.levels[split]
        rows = [i for i in self.rows[split] if not bucket or (levels[i] if levels else "all") == bucket]
        if not rows:
            raise ValueError(f"task {self.name}: the {split} split has no row of difficulty {bucket!r}")
        rng = np.random.default_rng(stable_hash("dataset", self.seed, split, bucket, epoch))
        return np.asarray(rows) if split == "test" else rng.permutation(rows)

    def _pick(self, split: Split, bucket: str, index: int) -> dict[str, Any]:
        n = len(self._order(split, bucket, 0))
        row = int(self._order(split, bucket, index // n)[index % n])
        return {"split": split, "row": row, "prompt": self.tables[split][row][self.params.prompt_field]}

    def row(self, problem: dict[str, Any]) -> dict[str, Any]:
        return dict(self.tables[problem["split"]][problem["row"]])

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        value = self.row(problem)[self.params.prompt_field]
        if isinstance(value, str):
            return Prompt("", value, "")
        ok = isinstance(value, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
        turns = [{"role": m["role"], "content": m["content"]} for m in value] if ok else []
        system = turns.pop(0)["content"] if turns and turns[0]["role"] == "system" else ""
        if not turns or turns[-1]["role"] != "user":
            raise TaskError(
                f"row {problem['row']} of the {problem['split']} split: a chat prompt is a list of "
                "{'role', 'content'} messages ending with a user message"
            )
        return Prompt(system, turns[-1]["content"], "", tuple(turns[:-1]))

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        return self.score_many([problem], [completion])[0]

    def score_many(self, problems: list[dict[str, Any]], completions: list[str]) -> list[Score]:
        rows = [self.row(p) for p in problems]
        if not rows:
            return []
        values = [call_reward(r, completions, rows, self.params) for r in self.rewards]
        scores = []
        for i, problem in enumerate(problems):
            got = {r.name: v[i] for r, v in zip(self.rewards, values)}
            error = next((g for g in got.values() if isinstance(g, str)), None)
            given = {name: g for name, g in got.items() if g is not None}
            if error is None and not given:
                error = f"reward function {', '.join(got)} returned None (none applies to this sample)"
            if error is not None:
                scores.append(unscored("verifier_error", "reward_error", f"{error} (row {problem['row']})"))
                continue
            total = sum(r.weight * given[r.name] for r in self.rewards if r.name in given)
            first = given.get(self.rewards[0].name)
            info = {"reason": "scored", "rewards": given}
            scores.append(Score(total, first is not None and first >= self.params.correct_at, info))
        return scores

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        answer = self.row(problem).get(self.params.answer_field)
        return None if answer is None else str(answer)
