"""Weight transfer: a policy's weights as named tensors (tied duplicates left out), loaded into another model
of the same architecture (a sampler's, a Ray actor's, a checkpoint's) and re-tied there."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]


class WeightsMismatch(ValueError):
    """A state dict does not fit the model it is loaded into; the message lists the names."""


def untied_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors with tied duplicates removed (safetensors refuses shared storage); the copy kept is
    the input embedding, as transformers expects when it re-ties on load."""
    sd = model.state_dict()
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name in sorted(sd, key=lambda n: (n.startswith("lm_head"), n)):
        t = sd[name]
        if t.data_ptr() not in seen or t.numel() == 0:
            seen.add(t.data_ptr())
            out[name] = t
    return out


def tensors_sha256(named: Mapping[str, torch.Tensor]) -> str:
    """Hash of named tensors (names, dtypes, shapes and bytes, in name order): equal iff bit-identical."""
    h = hashlib.sha256()
    for name, t in sorted(named.items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def load_untied(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy `weights` (a state dict without tied duplicates, as `untied_state_dict` makes) into `model` and
    re-tie. Every tensor but the tied copies must be there, and nothing else: WeightsMismatch otherwise."""
    tied = set(model.state_dict()) - set(untied_state_dict(model))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - tied:
        raise WeightsMismatch(
            f"missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)} (the weights must come from a "
            "model of the same architecture)"
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def owns(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> bool:
    """True when `weights` are `model`'s own tensors (names and storage): loading them would copy nothing."""
    own = model.state_dict()
    return untied_state_dict(model).keys() <= weights.keys() and all(
        name in own and own[name].data_ptr() == t.data_ptr() and own[name].device == t.device
        for name, t in weights.items()
    )
