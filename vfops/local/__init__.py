"""Local CPU models: build a tiny offline chat model and run it in-process.

Needs the ``[train]`` extra (torch, transformers, tokenizers). Importing this
package is cheap: torch/transformers load only when a name below is first used.

- :func:`build_tiny_model` / :class:`TinyModelConfig`: write a tiny random
  Llama-architecture chat model (locally trained BPE tokenizer, ChatML template).
- :func:`import_gguf` / :func:`find_gguf`: a GGUF file (a path, or a package shipping
  one) as a plain checkpoint folder, once per file (``vfops model import``).
- :class:`LocalModelClient`: a :class:`~vfops.clients.ModelClient` that generates
  in-process, micro-batching concurrent requests.
- :class:`BatchedGenerator` (with :class:`Sampling`, :class:`Sampled`,
  :data:`ComputeRunner`, :func:`derive_seed`, :func:`assistant_message`): the one
  batched in-process sampler, shared by :class:`LocalModelClient` and the
  trainer's ``hf`` backend.

Serve a model directory over HTTP with ``vfops model serve DIR`` (:mod:`vfops.local._server`;
``--engine transformers``: ``transformers serve``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports

if TYPE_CHECKING:
    from vfops.local._batched import (
        BatchedGenerator,
        ComputeRunner,
        Sampled,
        Sampling,
        assistant_message,
        derive_seed,
    )
    from vfops.local._client import LocalModelClient
    from vfops.local._gguf import ImportedModel, find_gguf, import_gguf
    from vfops.local._tiny import (
        TinyModelConfig,
        build_tiny_model,
        parameter_count,
        quiet_progress,
    )

__all__ = [
    "BatchedGenerator",
    "ComputeRunner",
    "ImportedModel",
    "LocalModelClient",
    "Sampled",
    "Sampling",
    "TinyModelConfig",
    "assistant_message",
    "build_tiny_model",
    "derive_seed",
    "find_gguf",
    "import_gguf",
    "parameter_count",
    "quiet_progress",
]

_LAZY = {
    "quiet_progress": "vfops.local._tiny",
    "parameter_count": "vfops.local._tiny",
    "BatchedGenerator": "vfops.local._batched",
    "ComputeRunner": "vfops.local._batched",
    "Sampled": "vfops.local._batched",
    "Sampling": "vfops.local._batched",
    "assistant_message": "vfops.local._batched",
    "derive_seed": "vfops.local._batched",
    "LocalModelClient": "vfops.local._client",
    "ImportedModel": "vfops.local._gguf",
    "find_gguf": "vfops.local._gguf",
    "import_gguf": "vfops.local._gguf",
    "TinyModelConfig": "vfops.local._tiny",
    "build_tiny_model": "vfops.local._tiny",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
