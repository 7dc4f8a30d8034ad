"""`[model.lora]`: LoRA's settings (keelrl/models/lora.py has the code). Pydantic only: `keelrl.config` imports this
without importing peft or torch."""

from __future__ import annotations

from pydantic import Field, model_validator

from keelrl.config.base import Section


class LoraConfig(Section):
    rank: int = Field(
        0,
        ge=0,
        description=(
            "LoRA rank r: train low-rank adapters (peft, `pip install keelrl[peft]`) on the frozen policy instead of "
            "all its weights; 0 (the default) trains every weight. Checkpoints then hold the adapter only; the "
            "final export is merged HF weights in final/ and a peft adapter in final/adapter/ (keelrl/models/lora.py)."
        ),
    )
    alpha: float = Field(
        16.0, gt=0, description="LoRA alpha: the adapter's update B @ A is scaled by alpha / rank."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description=(
            "LoRA dropout; must be 0: keelrl keeps the policy in eval mode while it trains (deterministic updates, "
            "bit-exact resume), so dropout would never act, and a value here would only mislead."
        ),
    )
    target_modules: str | list[str] = Field(
        "all-linear",
        description=(
            "The layers that get adapters, as peft reads them: 'all-linear' (every linear projection of the "
            "decoder: attention and MLP, not the output head) or a list of module-name suffixes, e.g. "
            "['q_proj', 'v_proj']."
        ),
    )
    init_seed: int = Field(
        0,
        description="Seed of the adapters' random initial A matrices (B starts at 0: the policy starts as the base).",
    )

    @model_validator(mode="after")
    def _usable(self) -> LoraConfig:
        if self.dropout > 0:
            raise ValueError(
                f"model.lora.dropout={self.dropout:g} would never act: keelrl keeps the policy in eval mode while it "
                "trains (deterministic updates, bit-exact resume). Set model.lora.dropout = 0."
            )
        if isinstance(self.target_modules, list) and not all(m.strip() for m in self.target_modules):
            raise ValueError(
                "model.lora.target_modules must name at least one module (e.g. ['q_proj', 'v_proj']) or be "
                "'all-linear'"
            )
        return self
