"""LoRA (`model.lora.rank` > 0): low-rank adapters trained on a frozen policy, through peft.

- `apply_lora` injects peft's LoRA layers into the loaded policy in place (`peft.inject_adapter_in_model`): the
  policy stays the transformers model it was (same class, `get_decoder`, config, generation), its base weights
  are frozen, and only the adapters require a gradient, so the optimizer, DDP and the guards see the adapters
  alone. setup applies it before wrapping and the optimizer, for RL and SFT alike. The A matrices are drawn
  from `model.lora.init_seed`, the B matrices are zero, so the policy starts as the base model.
- Names: an adapted projection's base weight is `...q_proj.base_layer.weight` in the policy's state dict, its
  adapters `...q_proj.lora_A.default.weight` and `...lora_B.default.weight`. Files use peft's own layout
  (`base_model.model.<name>` without the adapter name), so a checkpoint's or export's adapter directory loads
  with `peft.PeftModel.from_pretrained(base, dir)`.
- Engines with their own copy of the weights (a sampling process, Ray actors, vLLM) build the base architecture
  and receive `merged_state_dict`: W + (alpha / r) B @ A under the base model's names, computed without
  touching the policy. The in-process sampler samples the policy itself, adapters and all.
- `base_sha256`: the sha256 of the base weights (as `checkpoint.weights_sha256` of the base model before
  the adapters went in); checkpoints record it with `model.path`, and a resume onto other base weights is
  refused. `checkpoint.weights_sha256(policy)` hashes base and adapters together (names, bytes): equal iff
  both are bit-identical.

Departures: no LoRA dropout (refused by the config: the policy trains in eval mode); no FSDP2 (DDP and one
process are tested); the KL reference (`algo.kl_coef` > 0) stays a separate frozen copy of the base, as without
LoRA, instead of peft's disabled-adapter forward (simpler; costs one more copy of the base weights).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from keelrl.config.lora import LoraConfig
from keelrl.models.load import ModelLoadError, count_parameters
from keelrl.models.weights import load_untied, tensors_sha256, untied_state_dict

ADAPTER = "default"  # peft's adapter name; keelrl holds one adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_PREFIX = "base_model.model."  # how peft's files name the wrapped model's tensors
_LORA_NAME = re.compile(r"\.(lora_[AB])\.default\.")  # an adapter tensor in the policy's state dict
_FILE_NAME = re.compile(r"\.(lora_[AB])\.")  # the same tensor in peft's files


class LoraError(ModelLoadError):
    """LoRA cannot be set up or loaded as configured; the message says what to change (a user error, exit 2)."""


class PeftMissing(ImportError, ModelLoadError):
    """model.lora asks for peft, which is not installed (an ImportError, and a user error: exit 2)."""


def import_peft() -> ModuleType:
    """peft, or an ImportError that says how to install it."""
    try:
        import peft
    except ImportError:
        raise PeftMissing(
            "model.lora.rank > 0 trains LoRA adapters with the peft package, which is not installed. Install it "
            "with `pip install keelrl[peft]` (or `pip install peft`), or set model.lora.rank = 0."
        ) from None
    return peft


def has_lora(model: torch.nn.Module) -> bool:
    """Whether `model` carries keelrl's LoRA adapters (`apply_lora`)."""
    return any(_LORA_NAME.search(name) for name, _ in model.named_parameters())


def base_sha256(model: torch.nn.Module) -> str:
    """sha256 of the base weights of a LoRA policy (or of a plain model), as `tensors_sha256` of the base
    model's own state dict: the same value before and after `apply_lora`, whatever the adapters hold."""
    return tensors_sha256(
        {_base_name(n): t for n, t in untied_state_dict(model).items() if not _LORA_NAME.search(n)}
    )


def apply_lora(model: PreTrainedModel, cfg: LoraConfig, base_path: str) -> dict[str, Any]:
    """Inject LoRA adapters into `model` in place (see the module docstring) and freeze everything else.
    Returns the record checkpoints keep of the base: {"path", "weights_sha256"}. `base_path`: model.path."""
    peft = import_peft()
    local = Path(base_path).expanduser()
    path = str(local.resolve()) if local.exists() else base_path  # adapter dirs name their base
    record = {"path": path, "weights_sha256": base_sha256(model)}
    peft_cfg = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.init_seed)
        try:
            peft.inject_adapter_in_model(peft_cfg, model, adapter_name=ADAPTER)
        except ValueError as err:
            linear = sorted(
                {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
            )
            raise LoraError(
                f"model.lora.target_modules={cfg.target_modules!r} does not fit {type(model).__name__}: {err}. "
                f"Its linear layers are named {linear}; name some of them, or use 'all-linear'."
            ) from None
    for name, p in model.named_parameters():
        p.requires_grad_(bool(_LORA_NAME.search(name)))
    return record


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors, named as in peft's files (`base_model.model.<name>`, no adapter name)."""
    return {_file_name(n): t for n, t in model.state_dict().items() if _LORA_NAME.search(n)}


def load_adapter(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy adapter tensors in peft's file layout (`adapter_state_dict`) into `model`'s adapters, exactly.
    Every adapter tensor must be there with its shape, and nothing else: LoraError otherwise."""
    own = {n: t for n, t in model.state_dict().items() if _LORA_NAME.search(n)}
    named = {_policy_name(n): t for n, t in weights.items()}
    missing, unexpected = sorted(set(own) - set(named)), sorted(set(named) - set(own))
    wrong = sorted(n for n in set(own) & set(named) if own[n].shape != named[n].shape)
    if missing or unexpected or wrong:
        raise LoraError(
            f"the adapter does not fit this policy's LoRA layers: missing {missing[:4]}, unexpected {unexpected[:4]}, "
            f"other shapes {wrong[:4]} (it was trained with another model.lora.rank / target_modules or base model)"
        )
    with torch.no_grad():
        for n, t in named.items():
            own[n].copy_(t)


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of base + adapters as one plain model of the base architecture: W + (alpha / r) B @ A for
    each adapted layer, every other tensor as it is, under the base model's names (tied duplicates left out,
    as `untied_state_dict`). New tensors where merged; the policy is not changed. A model without adapters
    gives its `untied_state_dict`."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            deltas[f"{name}.base_layer.weight"] = module.get_delta_weight(ADAPTER)
    out: dict[str, torch.Tensor] = {}
    for name, t in untied_state_dict(model).items():
        if _LORA_NAME.search(name):
            continue
        t = t.detach()
        if name in deltas:
            t = t + deltas[name].to(t.dtype)
        out[_base_name(name)] = t
    return out


def sampler_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What an engine holding its own copy of the base architecture gets: the merged weights with LoRA, the
    policy's own tensors without."""
    return merged_state_dict(model) if has_lora(model) else untied_state_dict(model)


def merged_model(model: PreTrainedModel) -> PreTrainedModel:
    """A new plain model (the base architecture, no peft layers) holding base + adapters merged: what the final
    export writes. The policy is not changed."""
    from peft.tuners.lora import LoraLayer

    weights = merged_state_dict(model)
    out = copy.deepcopy(model)
    for name, module in list(out.named_modules()):
        if isinstance(module, LoraLayer):
            parent_name, _, child = name.rpartition(".")
            setattr(out.get_submodule(parent_name), child, module.get_base_layer())
    if hasattr(out, "peft_config"):
        del out.peft_config
    load_untied(out, weights)
    out.requires_grad_(False)
    return out


def adapter_config(model: torch.nn.Module, base_path: str) -> dict[str, Any]:
    """peft's adapter_config.json for `model`'s adapters, naming `base_path` as the base model."""
    peft_cfg = copy.deepcopy(model.peft_config[ADAPTER])  # type: ignore[index]
    peft_cfg.base_model_name_or_path = base_path
    peft_cfg.inference_mode = True
    # sets (the resolved target modules) are not JSON
    return {k: sorted(v) if isinstance(v, set) else v for k, v in peft_cfg.to_dict().items()}


def save_adapter_dir(model: torch.nn.Module, out: Path, base_path: str) -> None:
    """Write a peft adapter directory (adapter_config.json + adapter_model.safetensors) that
    `peft.PeftModel.from_pretrained(base, out)` loads onto the base model."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to("cpu").contiguous() for k, v in adapter_state_dict(model).items()}
    save_file(weights, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(model, base_path), indent=2, default=str))


def read_adapter(directory: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a peft adapter directory (peft's file layout, on CPU)."""
    return load_file(str(directory / ADAPTER_WEIGHTS))


def lora_summary(model: torch.nn.Module) -> dict[str, int]:
    """Parameter counts of a LoRA policy: the adapters' (trained) and the whole model's."""
    trained = sum(p.numel() for n, p in model.named_parameters() if _LORA_NAME.search(n))
    return {"adapter_parameters": trained, "parameters": count_parameters(model)}


def _base_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


def _file_name(name: str) -> str:
    return PEFT_PREFIX + _LORA_NAME.sub(r".\1.", name)


def _policy_name(name: str) -> str:
    return _FILE_NAME.sub(rf".\1.{ADAPTER}.", name.removeprefix(PEFT_PREFIX))
