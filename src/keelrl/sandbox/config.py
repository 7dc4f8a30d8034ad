"""`[sandbox]`: where model-written things run, the same for every task that runs them. Pydantic only
(`keelrl.config` imports it). Agentic episodes (`dir:` Harbor tasks, `swebench:` instances) read backend, runtime
and agent_network (sandbox/boxes.py); the code sandbox (tasks code, code_feedback, swe_mini) reads isolation
(sandbox/isolation.py). `get_task(..., sandbox=)` hands the section to the tasks in `keelrl.tasks.SANDBOXED`; none of
these is a task parameter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["auto", "container", "bwrap"] = Field(
        "auto",
        description="Where agentic episodes run: container (podman or docker, each task's own image), bwrap "
        "(bubblewrap over the host's programs; a task's Dockerfile is not built); auto: container where a runtime "
        "works, else bwrap with a warning.",
    )
    runtime: Literal["auto", "podman", "docker"] = Field(
        "auto", description="The container command line (auto: podman, else docker)."
    )
    agent_network: bool = Field(
        False,
        description="Network for the agent's commands in training episodes (off: a policy with the internet can "
        "look answers up); a task's verifier and oracle get the network the task states.",
    )
    isolation: Literal["auto", "bwrap", "unshare", "rlimit"] = Field(
        "auto",
        description="The code sandbox's isolation (tasks code, code_feedback, swe_mini): auto picks the strongest "
        "that works here (bwrap > unshare > rlimit).",
    )


def sandbox_of(value: SandboxConfig | Mapping[str, Any] | None) -> SandboxConfig:
    """The section from a config's own object, its JSON form (a run's config.json) or None (the defaults)."""
    return value if isinstance(value, SandboxConfig) else SandboxConfig.model_validate(dict(value or {}))


def moved_to_sandbox(params: Mapping[str, Any]) -> str | None:
    """A sentence when task parameters hold a [sandbox] setting (they used to), else None."""
    moved = [k for k in params if k in SandboxConfig.model_fields]
    if not moved:
        return None
    keys = ", ".join(f"sandbox.{k} = {params[k]!r}" for k in moved)
    return (
        f"task.params.{moved[0]} is not a task parameter: where tasks run is the [sandbox] section, one setting for "
        f"every task. Set {keys} instead (TOML: a [sandbox] table; command line: --set sandbox.{moved[0]}=...)."
    )
