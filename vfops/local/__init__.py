"""Local CPU models: build a tiny offline chat model and run it in-process.

Needs the ``[train]`` extra (torch, transformers, tokenizers). Importing this
package is cheap: torch/transformers load only when a name below is first used.

- :func:`build_tiny_model` / :class:`TinyModelConfig`: write a tiny random
  Llama-architecture chat model (locally trained BPE tokenizer, ChatML template).
- :class:`LocalModelClient`: a :class:`~vfops.clients.ModelClient` that generates
  in-process, micro-batching concurrent requests.

Serve a model directory over HTTP with ``vfops model serve DIR`` (``transformers serve``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vfops.local._client import LocalModelClient
    from vfops.local._tiny import TinyModelConfig, build_tiny_model

__all__ = ["LocalModelClient", "TinyModelConfig", "build_tiny_model"]

_LAZY = {
    "LocalModelClient": "vfops.local._client",
    "TinyModelConfig": "vfops.local._tiny",
    "build_tiny_model": "vfops.local._tiny",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
