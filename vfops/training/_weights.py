"""Full-precision, adapter-merged weights of the policy, for syncing generation.

Heavy module (torch): imported lazily.
"""

from __future__ import annotations

import contextlib
from typing import Any


def unwrap(model: Any) -> Any:
    """The module under DDP/DeepSpeed/compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def full_state_dict(model: Any) -> dict[str, Any]:
    """``{name: tensor}`` as the plain base model names them, LoRA adapters merged in.

    Under DeepSpeed ZeRO-3 the parameters are gathered first. The tensors are
    detached copies: the caller may hold them while training continues.
    """
    model = unwrap(model)
    with _gathered(model):
        if hasattr(model, "merge_adapter"):  # a peft model: merge, read, unmerge
            model.merge_adapter()
            try:
                return {
                    _base_name(k): v.detach().clone()
                    for k, v in model.state_dict().items()
                    if "lora_" not in k
                }
            finally:
                model.unmerge_adapter()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _base_name(name: str) -> str:
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def _gathered(model: Any) -> contextlib.AbstractContextManager[Any]:
    params = list(model.parameters())
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)  # type: ignore[no-any-return]
