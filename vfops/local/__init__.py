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

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.local._client import LocalModelClient
    from vfops.local._tiny import TinyModelConfig, build_tiny_model, parameter_count

__all__ = [
    "LocalModelClient",
    "TinyModelConfig",
    "build_tiny_model",
    "parameter_count",
]

_LAZY = {
    "parameter_count": "vfops.local._tiny",
    "LocalModelClient": "vfops.local._client",
    "TinyModelConfig": "vfops.local._tiny",
    "build_tiny_model": "vfops.local._tiny",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
