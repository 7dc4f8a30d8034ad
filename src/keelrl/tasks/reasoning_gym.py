"""reasoning-gym datasets as keelrl tasks: `reasoning_gym:<dataset>` (e.g. `reasoning_gym:chain_sum`).

reasoning-gym (github.com/open-thought/reasoning-gym, `pip install 'keelrl[envs]'`): about a hundred procedural
generators (arithmetic, logic, puzzles, graphs, ...), each with its own checker, asked and scored here.

Problem: `{"dataset", "question", "answer", "metadata", "bucket", "source"}`: the generator's entry (question,
reference answer, which some datasets lack and leave None, and metadata made JSON-safe: tuples as lists, other
objects as their repr), the difficulty bucket it was drawn as, and where it came from (`{"level", "seed",
"index"}`: curriculum level or None, the generator's seed, its index). Problem `index` of a split is entry
`index % size` of a generator seeded by a hash of (task seed, level, split, index // size, attempt); attempts go
on until the question's hash puts it in that split (`in_test_split` on the question text), so train and test
never share a question, whatever the generator repeats. `params` go to the dataset's config (what
`reasoning_gym.create_dataset(name, **params)` takes); the task sets its seed and size.

Reward: the dataset's own `score_answer(answer, entry)` on the last `<answer>...</answer>` block, stripped of
surrounding whitespace (as reasoning-gym's `extract_answer` does). Its value is a float in [0, 1] and often
partial (e.g. a wrong answer that contains the right one). `correct` is strict: the checker gave exactly 1.0.
The reward is 1.0 or 0.0 by `correct`, or the checker's value with `partial_credit`; no answer block is 0.0.
There is no format credit. `info["reason"]`: correct, partial (0 < value < 1), wrong, no_answer,
non_ascii_digit, checker_error (the checker raised: reward 0), checker_timeout.

Difficulty: reasoning-gym's curricula (`reasoning_gym.factory.create_curriculum`) are the buckets. Bucket `L<k>`
is the config the dataset's curriculum makes at global level k, each attribute's range its level's own range
(`RangeAttributeMode.UPPER_BOUND`, so levels do not overlap; `params` set the fields the curriculum does not),
easiest first, from `min_level` up to `max_level` (default: the last). Every level is checked when the ladder is
first asked for (a curriculum's set-up): one that cannot generate its first problems of both splits is a TaskError
naming it (spell_backward's L4 wants 11-letter words its word list lacks; game_of_life_halting's L2 has two
questions, both in the test split). Without a curriculum the one bucket is "all". `problem()` draws from
`params` alone (sequential runs, evaluation); its bucket is the entry's `metadata["difficulty"]` written
compactly ("2-6,1-4" for num_terms (2, 6), num_digits (1, 4)), or "all".

Where this departs from reasoning-gym, and why:
- The checker scores the generator's own entry, regenerated from `source` (cached) rather than rebuilt from
  JSON: some checkers compare tuples (arc_agi, rearc) and would fail a JSON round trip. A problem whose entry
  cannot be regenerated (another reasoning-gym version, a hand-made dict) is scored with its stored question,
  answer and metadata.
- Checkers are third-party code on model output; some hang on answers like `9**9**9**9` (sympy in
  simple_integration, polynomial_multiplication, puzzle24, ...). They run in one helper process per Python
  process with a limit of `timeout_s` (a checker over it scores 0, `checker_timeout`, and the process is
  restarted); `timeout_s = 0` runs them in-process.
- Only ASCII digits are numbers: an answer holding another decimal digit (`٢٦`, full-width `２６`, which
  Python's int() reads as 26) scores 0 (`non_ascii_digit`) unless the reference answer holds one too.
- A generator that raises on an entry (countdown's levels 1-2 give up on some seeds) is asked again with the
  next attempt's seed, as for a question of the other split; the problem fails only when every attempt does.
- Seeds: reasoning-gym seeds entry i of a generator with seed s as `Random(s + i)`, so nearby seeds
  overlap. Generator seeds here are hashes (31 bits), and splits are by question text anyway.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import difflib
import itertools
import logging
import math
import os
import pickle
import select
import subprocess
import sys
import threading
from collections import OrderedDict
from typing import Any

from pydantic import Field

from keelrl.core.seeds import stable_hash
from keelrl.tasks.base import (
    ANSWER_PREFIX,
    NON_ASCII_DIGIT,
    Prompt,
    Score,
    Split,
    TaskParams,
    Template,
    check_bucket,
    in_test_split,
    instruct_prompt,
    last_answer,
)

logger = logging.getLogger("keelrl.tasks.reasoning_gym")

ALL = "all"
USER_SUFFIX = (
    "\n\nShow your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, "
    "with nothing else inside them."
)
USER_SUFFIX_ANSWER_ONLY = "\n\nGive only the final answer, in <answer> </answer> tags."
INSTALL_HINT = "pip install 'keelrl[envs]' (or pip install reasoning-gym)"
DATASET_CACHE = 64  # generator instances kept per task (a split pass uses a few; test, about 1 per miss)
ENTRY_CACHE = 4096  # generated entries kept for scoring without regenerating
PREPARE_TIMEOUT_S = 300.0  # the checker process's start and a dataset's construction (arc_agi: seconds)
MAX_BUCKET_CHARS = 40
LEVEL_CHECK_PROBLEMS = 8  # each curriculum level's first problems of each split, generated when it is checked


class ReasoningGymParams(TaskParams):
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the dataset's config (reasoning-gym's <Dataset>Config), e.g. "
        "{min_terms = 2, max_terms = 3} for chain_sum; seed and size are set by the task. In curriculum "
        "buckets the curriculum sets the fields its attributes cover.",
    )
    size: int = Field(
        1000,
        ge=1,
        le=20_000,
        description="Entries per generator: problem i of a split is entry i % size of a generator seeded "
        "for i // size. Some datasets build all entries up front (acre) or cap it (word_ladder: 20000).",
    )
    test_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of questions (by a hash of the text) held out for test."
    )
    think: bool = Field(
        True,
        description="base/chat templates: ask for reasoning in <think> tags before the answer. False asks "
        "for the answer only and starts the assistant turn at '<answer>'.",
    )
    partial_credit: bool = Field(
        False,
        description="Reward the checker's value (reasoning-gym's partial credit, in [0, 1]) instead of "
        "1.0 for exactly right and 0.0 otherwise. Accuracy is exact either way.",
    )
    timeout_s: float = Field(
        5.0,
        ge=0.0,
        le=600.0,
        description="Time limit of one checker call, run in a helper process (a call over it scores 0). "
        "0 runs checkers in this process without a limit (some hang on answers like 9**9**9**9).",
    )
    max_level: int | None = Field(
        None, ge=0, description="Highest curriculum level in the difficulty ladder (default: all levels)."
    )
    min_level: int = Field(
        0, ge=0, description="Lowest curriculum level in the ladder (e.g. its hardest alone)."
    )


def _task_error(message: str) -> Exception:
    from keelrl.tasks import TaskError  # keelrl.tasks imports this package's modules lazily

    return TaskError(message)


def _registry() -> dict[str, Any]:
    """reasoning-gym's dataset registry (name -> (dataset class, config class)); TaskError if absent."""
    try:
        import reasoning_gym  # noqa: F401  (registers every dataset)
        from reasoning_gym.factory import DATASETS
    except ImportError as err:
        raise _task_error(
            f"reasoning_gym tasks need the reasoning-gym package ({err}): {INSTALL_HINT}"
        ) from None
    return DATASETS


def jsonable(value: Any) -> Any:
    """`value` as plain JSON: tuples and sets as lists, dict keys as strings, non-finite floats and
    other objects as their repr."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return repr(value)


def _compact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        parts = [_compact(v) for v in value]
        if len(parts) == 2 and all(isinstance(v, (int, float)) for v in value):
            return parts[0] if parts[0] == parts[1] else f"{parts[0]}-{parts[1]}"
        return "/".join(parts)
    if isinstance(value, dict):
        return ",".join(_compact(v) for v in value.values())
    return str(value)


def difficulty_name(metadata: Any) -> str:
    """A short bucket name from an entry's `metadata["difficulty"]`: its values, ranges as lo-hi, joined
    by commas ({"num_terms": (2, 6), "num_digits": (1, 4)} -> "2-6,1-4"); "all" when there is none."""
    found = metadata.get("difficulty") if isinstance(metadata, dict) else None
    if found is None or found == {}:
        return ALL
    name = _compact(found).replace(" ", "")
    if len(name) > MAX_BUCKET_CHARS:
        name = f"{name[: MAX_BUCKET_CHARS - 9]}~{stable_hash(name) % 16**8:08x}"
    return name


class _LRU:
    def __init__(self, capacity: int) -> None:
        self.capacity, self.items = capacity, OrderedDict[Any, Any]()

    def get(self, key: Any) -> Any | None:
        if key in self.items:
            self.items.move_to_end(key)
        return self.items.get(key)

    def put(self, key: Any, value: Any) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)


class ReasoningGymTask:
    """One reasoning-gym dataset as a keelrl task (module docstring)."""

    def __init__(self, dataset: str, seed: int = 0, **params: Any) -> None:
        self.params = ReasoningGymParams(**params)
        registry = _registry()
        if dataset not in registry:
            close = difflib.get_close_matches(dataset, registry, n=3, cutoff=0.5)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise _task_error(
                f"unknown reasoning_gym dataset {dataset!r}{hint}; the {len(registry)} datasets: "
                f"{', '.join(sorted(registry))}. Name the task 'reasoning_gym:<dataset>'."
            )
        self.name = f"reasoning_gym:{dataset}"
        self.dataset, self.seed = dataset, seed
        self._dataset_cls, self._config_cls = registry[dataset]
        self._lock = threading.RLock()
        self._configs: dict[int | None, Any] = {}
        self._datasets, self._entries = _LRU(DATASET_CACHE), _LRU(ENTRY_CACHE)
        self._checkers: dict[int | None, Any] = {}  # level -> a dataset instance to score with
        self._buckets: list[str] | None = None
        self._config(None)  # a wrong parameter fails here, with the config's fields listed

    # -- the Task protocol

    def problem(self, split: Split, index: int) -> dict[str, Any]:
        return self._generate(split, index, None)

    def prompt(self, problem: dict[str, Any], template: Template) -> Prompt:
        question = str(problem["question"])
        if template == "compact":
            return Prompt("", question, ANSWER_PREFIX)
        suffix = USER_SUFFIX if self.params.think else USER_SUFFIX_ANSWER_ONLY
        return instruct_prompt(template, question + suffix, self.params.think)

    def score(self, problem: dict[str, Any], completion: str) -> Score:
        found = last_answer(completion)
        if found is None:
            return Score(0.0, False, {"formatted": False, "reason": "no_answer"})
        answer = found.strip()
        entry, level = self._entry(problem)
        info: dict[str, Any] = {"formatted": True, "answer": answer[:80]}
        if NON_ASCII_DIGIT.search(answer) and not NON_ASCII_DIGIT.search(str(entry.get("answer"))):
            return Score(0.0, False, {**info, "reason": "non_ascii_digit", "checker_score": 0.0})
        value, error = self._check(level, answer, entry)
        if error is not None:
            reason = "checker_timeout" if error == "timeout" else "checker_error"
            return Score(0.0, False, {**info, "reason": reason, "error": error})
        correct = value == 1.0
        reason = "correct" if correct else "partial" if value > 0.0 else "wrong"
        reward = value if self.params.partial_credit else float(correct)
        return Score(reward, correct, {**info, "reason": reason, "checker_score": value})

    def difficulty(self, problem: dict[str, Any]) -> str:
        bucket = problem.get("bucket")
        return bucket if isinstance(bucket, str) else difficulty_name(problem.get("metadata"))

    def reference_answer(self, problem: dict[str, Any]) -> str | None:
        """The generator's answer; None for datasets without a single one (propositional_logic, ...)."""
        answer = problem.get("answer")
        return None if answer is None else str(answer)

    # -- BucketedTask

    def buckets(self) -> list[str]:
        """Curriculum levels L0, L1, ..., easiest first (see the module docstring), or ["all"]."""
        if self._buckets is None:
            self._buckets = self._ladder()
        return list(self._buckets)

    def problem_in(self, bucket: str, split: Split, index: int) -> dict[str, Any]:
        """The `index`-th problem of `split` at curriculum level `bucket` (its own seeded generators);
        for a dataset without a curriculum, `problem(split, index)` under the bucket "all"."""
        check_bucket(self, bucket)
        if bucket == ALL:
            return {**self.problem(split, index), "bucket": ALL}
        return self._generate(split, index, int(bucket[1:]))

    # -- generators

    def _ladder(self) -> list[str]:
        from reasoning_gym.factory import create_curriculum, has_curriculum

        if not has_curriculum(self.dataset):
            return [ALL]
        attributes = create_curriculum(self.dataset).attributes.values()
        top = max((len(a.levels) for a in attributes), default=1) - 1
        if self.params.max_level is not None:
            top = min(top, self.params.max_level)
        first = self.params.min_level
        if first > top:
            raise _task_error(f"task {self.name}: min_level {first} is above its highest level, {top}")
        for level in range(first, top + 1):
            try:
                for split, index in itertools.product(("train", "test"), range(LEVEL_CHECK_PROBLEMS)):
                    self._generate(split, index, level)  # type: ignore[arg-type]
            except Exception as err:  # a third-party generator: any error fails the level
                fix = f"set task.params.max_level = {level - 1}" if level > first else "change its params"
                raise _task_error(
                    f"task {self.name}: curriculum level L{level} cannot produce problems ({err}); {fix}"
                ) from err
        return [f"L{level}" for level in range(first, top + 1)]

    def _config(self, level: int | None) -> Any:
        """The dataset config at `level` (None: `params` alone), seed 0; validated."""
        with self._lock:
            if level in self._configs:
                return self._configs[level]
            defaults = {**self.params.params, "seed": 0, "size": self.params.size}
            if level is None:
                for key in ("seed", "size"):
                    if key in self.params.params:
                        raise _task_error(
                            f"task {self.name}: params.{key} is set by the task (seed: the task seed, size: its "
                            "size parameter); remove it"
                        )
                try:
                    config = self._config_cls(**defaults)
                except TypeError as err:
                    fields = [
                        f.name for f in dataclasses.fields(self._config_cls) if f.name not in ("seed", "size")
                    ]
                    raise _task_error(
                        f"task {self.name}: bad params ({err}); {self._config_cls.__name__} takes: {', '.join(fields)}"
                    ) from None
            else:
                from reasoning_gym.coaching import base_curriculum
                from reasoning_gym.factory import create_curriculum

                curriculum = create_curriculum(self.dataset)
                curriculum.set_global_level(level)
                mode = base_curriculum.RangeAttributeMode.UPPER_BOUND
                context = base_curriculum.DefaultCurriculumContext(mode=mode)
                config = curriculum.generate_configuration(defaults, context)
            validate = getattr(config, "validate", None)
            if callable(validate):
                try:
                    validate()
                except (AssertionError, ValueError, TypeError) as err:
                    where = "params" if level is None else f"curriculum level {level} with params"
                    raise _task_error(
                        f"task {self.name}: invalid {where}: {err or type(err).__name__}"
                    ) from None
            self._configs[level] = config
            return config

    def _generator(self, level: int | None, ds_seed: int) -> Any:
        with self._lock:
            found = self._datasets.get((level, ds_seed))
            if found is None:
                config = dataclasses.replace(self._config(level), seed=ds_seed, size=self.params.size)
                found = self._dataset_cls(config=config)
                self._datasets.put((level, ds_seed), found)
            return found

    def _generate(self, split: Split, index: int, level: int | None) -> dict[str, Any]:
        """Entries of seeded generators until one's question is in `split` (module docstring)."""
        p, _ = self.params, self._config(level)  # an invalid level's config: its TaskError now, not per try
        pass_no, offset = divmod(index, p.size)
        share = p.test_fraction if split == "test" else 1.0 - p.test_fraction
        attempts, failed = math.ceil(50 / share), None  # missing them all: below e^-50
        for attempt in range(attempts):
            ds_seed = (
                stable_hash("reasoning_gym", self.dataset, self.seed, level, split, pass_no, attempt) % 2**31
            )
            try:
                entry = self._generator(level, ds_seed)[offset]
            except Exception as err:  # generators are third-party code: the next attempt's seed
                failed = f"{type(err).__name__}: {err}"
                continue
            question = str(entry["question"])
            if in_test_split(question, self.seed, p.test_fraction) == (split == "test"):
                with self._lock:
                    self._entries.put((level, ds_seed, offset), entry)
                metadata = jsonable(entry.get("metadata", {}))
                return {
                    "dataset": self.dataset,
                    "question": question,
                    "answer": None if entry.get("answer") is None else str(entry["answer"]),
                    "metadata": metadata,
                    "bucket": difficulty_name(metadata) if level is None else f"L{level}",
                    "source": {"level": level, "seed": ds_seed, "index": offset},
                }
        why = f"each try failed (last: {failed})" if failed else f"no {split} question in {attempts} tries"
        where = "params" if level is None else f"level {level}"
        raise RuntimeError(
            f"task {self.name} ({where}): {split} problem {index}: {why}; widen its params (the dataset may "
            "repeat too few distinct questions for test_fraction)"
        )

    # -- scoring

    def _entry(self, problem: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """The generator's own entry for `problem` and its level, else one rebuilt from the problem."""
        stored = {k: problem.get(k) for k in ("question", "answer", "metadata")}
        source = problem.get("source")
        if not isinstance(source, dict) or problem.get("dataset", self.dataset) != self.dataset:
            return stored, None
        level, ds_seed, index = source.get("level"), source.get("seed"), source.get("index")
        if not isinstance(level, int | None) or not all(isinstance(x, int) for x in (ds_seed, index)):
            return stored, None
        with self._lock:
            entry = self._entries.get((level, ds_seed, index))
        if entry is None:
            try:
                entry = self._generator(level, ds_seed)[index]
            except Exception:  # a stale or foreign source: fall back to the stored fields
                return stored, level
            with self._lock:
                self._entries.put((level, ds_seed, index), entry)
        if str(entry.get("question")) != problem.get("question"):
            return stored, level
        return entry, level

    def _check(self, level: int | None, answer: str, entry: dict[str, Any]) -> tuple[float, str | None]:
        """(the checker's value clipped to [0, 1], None) or (0.0, error text; "timeout" for a timeout)."""
        try:
            config = self._config(level)
        except Exception:  # a level this task cannot build (a hand-made source): the params' config
            level, config = None, self._config(None)
        if self.params.timeout_s > 0 and _CHECKER.usable:
            key = f"{self.dataset}|{stable_hash(repr(config))}"
            status, value = _CHECKER.check(key, self.dataset, config, answer, entry, self.params.timeout_s)
            if status != "inline":
                return _clip(value) if status == "ok" else (0.0, str(value))
        try:
            with self._lock:
                checker = self._checkers.get(level)
                if checker is None:
                    checker = self._checkers[level] = self._dataset_cls(config=config)
            return _clip(checker.score_answer(answer, entry))
        except Exception as err:  # the checker is third-party code on model output
            return 0.0, f"{type(err).__name__}: {err}"[:300]


def _clip(value: Any) -> tuple[float, str | None]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0, f"checker returned {value!r:.80}"
    return (
        (min(max(number, 0.0), 1.0), None) if math.isfinite(number) else (0.0, f"checker returned {number}")
    )


class _CheckerProcess:
    """One helper process per Python process that runs checkers under a time limit (module docstring).
    Requests and replies are pickles on its stdin and stdout; a checker over the limit gets the process
    killed and a new one started on the next call. If the process cannot be started, checks run inline."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = -1  # the pid that started it: a forked child starts its own
        self.prepared: set[str] = set()
        self.usable = True

    def check(
        self, key: str, dataset: str, config: Any, answer: str, entry: dict[str, Any], timeout_s: float
    ) -> tuple[str, Any]:
        """("ok", value), ("error", text), ("error", "timeout"), or ("inline", why): check in-process."""
        try:
            request = pickle.dumps(("score", key, answer, entry))
            prepare = None if key in self.prepared else pickle.dumps(("prepare", key, dataset, config))
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            return "inline", f"unpicklable entry or config: {err}"
        with self.lock:
            if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
                if not self._start():
                    return "inline", "no checker process"
            if key not in self.prepared:  # a new process knows no dataset yet
                prepare = prepare or pickle.dumps(("prepare", key, dataset, config))
                status, value = self._call(prepare, PREPARE_TIMEOUT_S)
                if status != "ok":
                    if self.proc is None:  # it died or hung while starting: do not pay that on every call
                        logger.warning(
                            "reasoning_gym: the checker process failed (%s); checking inline, without a time limit",
                            value,
                        )
                        self.usable = False
                    return "inline", f"preparing {dataset} in the checker process failed: {value}"
                self.prepared.add(key)
            return self._call(request, timeout_s)

    def _start(self) -> bool:
        code = "from keelrl.tasks.reasoning_gym import checker_main; checker_main()"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
            )
        except (OSError, ValueError) as err:
            logger.warning(
                "reasoning_gym: cannot start the checker process (%s); checking inline, no time limit", err
            )
            self.usable = False
            return False
        self.owner, self.prepared = os.getpid(), set()
        return True

    def _call(self, request: bytes, timeout_s: float) -> tuple[str, Any]:
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(request)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            if not ready:
                self._stop()
                return "error", "timeout"
            reply = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as err:
            self._stop()
            return "error", f"checker process died ({type(err).__name__}: {err})"
        return reply

    def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or self.owner != os.getpid():
            return
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a dead reader: unflushed bytes cannot go anywhere
                    stream.close()

    def close(self) -> None:
        """At exit: end of input lets the process finish; one that does not is killed."""
        proc = self.proc
        if proc is None or self.owner != os.getpid() or proc.stdin is None:
            return
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.stdin.close()
            proc.wait(timeout=5)
        self._stop()


_CHECKER = _CheckerProcess()
atexit.register(_CHECKER.close)


def checker_main() -> None:
    """The checker process: read (prepare | score) requests from stdin, reply on stdout (the real one;
    fd 1 goes to stderr, so a checker that prints cannot corrupt replies). Exits at end of input."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which closes our stdin
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    registry = _registry()
    datasets: dict[str, Any] = {}
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            if request[0] == "prepare":
                _, key, name, config = request
                datasets[key] = registry[name][0](config=config)
                reply: tuple[str, Any] = ("ok", None)
            else:
                _, key, answer, entry = request
                reply = ("ok", datasets[key].score_answer(answer, entry))
            out.write(pickle.dumps(reply))
        except Exception as err:  # the checker is third-party code on model output
            out.write(pickle.dumps(("error", f"{type(err).__name__}: {err}"[:300])))
        out.flush()
