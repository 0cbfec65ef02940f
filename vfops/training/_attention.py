"""Which attention kernels the policy loads with: ``[model] attn_implementation`` resolved.

Light module (no torch): :func:`check_attention` runs before anything heavy (``vfops
train``'s one-line error when flash-attn is asked for and missing); the set-up passes
what only torch knows (a CUDA device, the mixed precision) to :func:`resolve_attention`.
flash-attn is looked up with ``find_spec``, never imported: importing it loads CUDA
kernels, and a broken build would fail far from the config that asked for it.
"""

from __future__ import annotations

import importlib.util

from vfops._errors import VfopsError
from vfops.training._config import GRPOConfig

FLASH = "flash_attention_2"
FALLBACK = "sdpa"
"""What ``auto`` resolves to without flash-attn, a GPU or bf16 (PyTorch's own kernels)."""


class AttentionUnavailableError(VfopsError):
    """``[model] attn_implementation`` names kernels this machine cannot run."""


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def check_attention(config: GRPOConfig) -> None:
    """Raise :class:`AttentionUnavailableError` when flash-attn is asked for and missing."""
    if config.model.attn_implementation == FLASH and not flash_attn_installed():
        raise AttentionUnavailableError(
            "[model] attn_implementation = 'flash_attention_2' but flash-attn is not "
            "installed; install the [gpu] extra on a CUDA machine (pip install "
            "'vfops[gpu]' --no-build-isolation) or set attn_implementation = 'sdpa' "
            "(or 'auto')"
        )


def resolve_attention(config: GRPOConfig, *, cuda: bool, mixed_precision: str) -> str:
    """The ``attn_implementation`` to load the model with: ``auto`` resolved (flash only
    with flash-attn, a CUDA device and bf16: its kernels take no fp32), an explicit value
    checked (:func:`check_attention`, and flash refused without a CUDA device)."""
    check_attention(config)
    asked = config.model.attn_implementation
    if asked == FLASH and not cuda:
        raise AttentionUnavailableError(
            "[model] attn_implementation = 'flash_attention_2' needs a CUDA GPU and none "
            "is visible; set attn_implementation = 'sdpa' (or 'auto')"
        )
    if asked != "auto":
        return asked
    if flash_attn_installed() and cuda and mixed_precision == "bf16":
        return FLASH
    return FALLBACK
