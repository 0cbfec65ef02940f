"""What a Hugging Face model folder holds, read without loading its weights.

:func:`adaptable_modules`: the names of the modules LoRA can adapt (those with a weight
of two or more dimensions: linear, embedding, convolution layers), from the safetensors
headers (the 8-byte length and JSON table at the start of each file: names and shapes,
a few KB, whatever the model's size; an output head tied to the embeddings is stored
once, so ``lm_head`` is added when ``config.json`` ties them) or, when the folder has no
safetensors, from the model built on the meta device (``accelerate.init_empty_weights``:
the module tree, no weights).

:func:`missing_targets`: LoRA ``target_modules`` entries that match none of them, with
peft's own matching rule (a module's full name, or its name's last dotted parts).

Light module: the headers are read with the standard library (a refusal costs no torch
import); torch and transformers load only for the meta-device fallback.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Iterable
from pathlib import Path

__all__ = ["adaptable_modules", "missing_targets"]

ALL_LINEAR = "all-linear"
"""peft's shorthand for every linear layer but the output head: always valid."""

_HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not one


def missing_targets(model_dir: Path, targets: Iterable[str]) -> list[str] | None:
    """The ``targets`` that match no adaptable module of the model in ``model_dir``,
    in order; None when the folder's modules cannot be read (then nothing is claimed)."""
    wanted = [t for t in targets if t != ALL_LINEAR]
    if not wanted:
        return []
    names = adaptable_modules(model_dir)
    if names is None:
        return None
    return [t for t in wanted if not _matches(t, names)]


def adaptable_modules(model_dir: Path) -> frozenset[str] | None:
    """Module names with a weight of 2+ dimensions, from the safetensors headers; else
    from the meta-device module tree; None when neither can be read."""
    from_headers = _header_modules(model_dir)
    if from_headers is not None:
        return from_headers
    return _meta_modules(str(model_dir), _stamp(model_dir))


def _matches(target: str, names: frozenset[str]) -> bool:
    # peft's check_target_module_exists for a list: the full name, or a suffix at a dot
    return target in names or any(name.endswith("." + target) for name in names)


def _header_modules(model_dir: Path) -> frozenset[str] | None:
    files = _safetensors_files(model_dir)
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        header = _read_header(file)
        if header is None:
            return None
        for tensor, info in header.items():
            if tensor == "__metadata__" or not isinstance(info, dict):
                continue
            shape = info.get("shape")
            module, _, leaf = tensor.rpartition(".")
            if module and leaf == "weight" and isinstance(shape, list) and len(shape) >= 2:
                names.add(module)
    if _ties_embeddings(model_dir):
        names.add(OUTPUT_HEAD)
    return frozenset(names)


OUTPUT_HEAD = "lm_head"
"""The output head's module name in transformers' causal LMs; not in the weights file
when it is tied to the input embeddings (stored once)."""


def _ties_embeddings(model_dir: Path) -> bool:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    # transformers writes only what differs from its defaults, and ties by default
    return isinstance(config, dict) and config.get("tie_word_embeddings", True) is True


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return [model_dir / name for name in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []
    return sorted(model_dir.glob("*.safetensors"))


def _read_header(file: Path) -> dict[str, object] | None:
    try:
        with file.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (length,) = struct.unpack("<Q", raw)
            if length > _HEADER_LIMIT:
                return None
            header = json.loads(f.read(length))
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _stamp(model_dir: Path) -> float:
    """The config file's modification time: the meta-device cache is kept per version."""
    try:
        return (model_dir / "config.json").stat().st_mtime
    except OSError:
        return 0.0


@functools.lru_cache(maxsize=8)
def _meta_modules(model_dir: str, stamp: float) -> frozenset[str] | None:
    """Adaptable module names of the model built on the meta device (no weights read);
    None when transformers cannot build it from its config."""
    try:
        import torch
        import transformers
        from accelerate import init_empty_weights
        from transformers.pytorch_utils import Conv1D

        config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with init_empty_weights():
            model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    except Exception:  # any failure here is the loader's to report, with its own message
        return None
    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, Conv1D)
    return frozenset(name for name, module in model.named_modules() if isinstance(module, kinds))
