"""Reading a config: TOML files, `--set KEY=VALUE` overrides, and validation errors a user can act on. Generic
over the pydantic model; `keelrl.config` applies it to `Config` (`load_config`, `config_from_dict`).
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config the user wrote cannot be run; the message says which field and what is allowed."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value); the value is read as TOML, else taken as a plain string."""
    if "=" not in text:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. --set algo.lr=3e-4), got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: the key {key!r} is not a dotted name such as algo.lr")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        set_key(data, *parse_override(text), f"--set {text!r}")
    return data


def set_key(data: dict[str, Any], path: list[str], value: Any, what: str) -> None:
    """data[path[0]][path[1]]... = value, making sections on the way; `what` names the override in errors."""
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{what}: {part!r} is a value, not a section")
        node = child
    node[path[-1]] = value


def read_toml(p: Path) -> dict[str, Any]:
    """The tables of a TOML config file; ConfigError when it is missing, not UTF-8 or not TOML."""
    if not p.is_file():
        raise ConfigError(
            f"config file {p} does not exist; shipped presets are in configs/ (e.g. configs/smoke.toml)"
        )
    raw = p.read_bytes()
    try:
        if p.suffix == ".json":  # what keelrl.train writes for its worker: the same tables
            return json.loads(raw)
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{p} is not UTF-8 text (byte {raw[err.start]:#04x} on line {line}); TOML files must be UTF-8. "
            "Save it again as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or remove the non-ASCII characters."
        ) from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{p} is not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {err}. Check quoting and [section] "
            "headers near that line."
        ) from None


def _known_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Names allowed at `loc` (the parent of the offending key)."""
    cls: Any = model
    for part in loc:
        field = cls.model_fields.get(part) if isinstance(part, str) and hasattr(cls, "model_fields") else None
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return []
        cls = field.annotation
    return list(cls.model_fields)


def _format_validation_error(err: ValidationError, model: type[BaseModel], source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = tuple(e["loc"])
        name = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _known_fields(model, loc[:-1])
            hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            section = ".".join(str(p) for p in loc[:-1]) or "top level"
            msg = f"unknown key `{name}`"
            if hint:
                msg += f" (did you mean `{'.'.join([*map(str, loc[:-1]), hint[0]])}`?)"
            msg += f"; allowed in [{section}]: {', '.join(allowed)}"
        else:
            given = e.get("input")
            shown = json.dumps(given, default=str) if not isinstance(given, dict) else "a table"
            msg = f"`{name}`: {e['msg']} (got {shown})" if loc else e["msg"]
        lines.append("  - " + msg.replace("Value error, ", ""))  # a validator's message as it wrote it
    return "\n".join(lines)


def validate(model: type[M], data: dict[str, Any], source: str) -> M:
    """`model` built from `data`; ConfigError listing every wrong field (`source` says where data came from)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, model, source)) from None


def describe_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default, description) for every leaf field: the generated config reference."""
    rows: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(describe_fields(ann, f"{prefix}{name}."))
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((prefix + name, json.dumps(default, default=str), field.description or ""))
    return rows
