"""Which runs a ladder makes: the product of its axes times its seeds, plus the held-out target's seeds. A run
is named after its grid point and seed, so a ladder started again finds the runs it already made."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from keelrl.config.ladder import LadderConfig
from keelrl.config.load import ConfigError, parse_override

Role = Literal["grid", "target"]


@dataclass(frozen=True)
class LadderRun:
    point: tuple[tuple[str, Any], ...]  # (config key, value) per axis: the grid point, in axis order
    seed: int
    role: Role = "grid"
    shown: tuple[str, ...] = ()  # each value as the label shows it (paths by their distinguishing end)

    @property
    def label(self) -> str:
        """The grid point, e.g. "path=base32,lr=0.0003"; the target's is prefixed with "target:"."""
        shown = self.shown or tuple(str(v) for _, v in self.point)
        text = ",".join(
            f"{key.rsplit('.', 1)[-1]}={v}" for (key, _), v in zip(self.point, shown, strict=True)
        )
        return f"target:{text or 'config'}" if self.role == "target" else text or "config"

    @property
    def name(self) -> str:
        """Directory name under OUT/runs: the label made file-safe, and the seed."""
        return (
            re.sub(r"[^A-Za-z0-9._=-]+", "_", self.label.replace("target:", "target_")) + f"__seed{self.seed}"
        )

    def overrides(self) -> list[str]:
        """`--set KEY=VALUE` items (TOML values) putting this run's point in the config."""
        return [f"{key}={toml_value(value)}" for key, value in self.point]


def path_depth(values: list[Any]) -> int:
    """How many trailing path parts tell an axis's values apart (0: not paths, show them whole)."""
    texts = [str(v).rstrip("/") for v in values]
    if not all("/" in t for t in texts):
        return 0
    for depth in range(1, max(t.count("/") for t in texts) + 2):
        if len({"/".join(t.split("/")[-depth:]) for t in texts}) == len(texts):
            return depth
    return 0


def _show(value: Any, depth: int) -> str:
    text = str(value)
    return "/".join(text.rstrip("/").split("/")[-depth:]) if depth and "/" in text else text


def toml_value(value: Any) -> str:
    """A value as `--set` reads it back (TOML): strings quoted, booleans lower case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    raise ConfigError(f"ladder axis values must be strings, numbers or booleans, got {value!r}")


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """`--axis KEY=V1,V2,...` -> (KEY, [values]) with each value read as `--set` reads one."""
    if "=" not in text:
        raise ConfigError(f"--axis expects KEY=V1,V2,... (e.g. --axis algo.lr=1e-4,3e-4), got {text!r}")
    key, raw = text.split("=", 1)
    values = [parse_override(f"{key}={item}")[1] for item in raw.split(",") if item.strip()]
    if not values:
        raise ConfigError(f"--axis {text!r} names no values")
    return key.strip(), values


def plan_runs(ladder: LadderConfig) -> tuple[list[LadderRun], list[LadderRun]]:
    """(grid runs, target runs). The target shares the grid's first point, with its own overrides on top."""
    keys = list(ladder.axes)
    for key, values in ladder.axes.items():
        if not values:
            raise ConfigError(f"ladder.axes[{key!r}] is empty; give at least one value")
        if len(set(map(str, values))) != len(values):
            raise ConfigError(f"ladder.axes[{key!r}] repeats a value: {values}")
    depth = {key: path_depth(values) for key, values in ladder.axes.items()}

    def shown(point: tuple[tuple[str, Any], ...]) -> tuple[str, ...]:
        return tuple(_show(v, depth.get(k, 0)) for k, v in point)

    points = [tuple(zip(keys, combo, strict=True)) for combo in itertools.product(*ladder.axes.values())]
    grid = [LadderRun(point, seed, "grid", shown(point)) for point in points for seed in range(ladder.seeds)]
    if not ladder.target:
        return grid, []
    target_point = tuple({**dict(points[0]), **ladder.target}.items())
    if target_point in points:
        raise ConfigError(
            f"ladder.target {ladder.target} is a point of the grid itself; name a point outside it"
        )
    seeds = ladder.target_seeds or ladder.seeds
    return grid, [LadderRun(target_point, seed, "target", shown(target_point)) for seed in range(seeds)]
