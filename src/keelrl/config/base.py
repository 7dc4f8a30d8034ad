"""What every config section is built from: `Section`, the base that refuses unknown keys and checks values
set after construction too, and `section`, the field that mounts one section in another. Pydantic only:
`keelrl.config` and each section's module import it without torch."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def section(model: type[BaseModel], description: str) -> Any:
    """A field holding the section `model` (its defaults unless the config sets some), described as given."""
    return Field(default_factory=model, description=description)
