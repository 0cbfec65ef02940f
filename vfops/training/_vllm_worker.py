"""Runs *inside* the vLLM server's workers (``--worker-extension-cls``): stdlib and
what the vLLM venv has, nothing else of vfops.

Why not vLLM's ``reload_weights`` alone: its layer-wise in-place reload refreshes
each reloaded layer, but an LM head tied to the embedding is not a layer of the
checkpoint, so whatever the head derived from the old weights at load time stays
(on the CPU build, a packed GEMM copy): after a sync the model read the new
embedding and wrote logits with the old head (measured: logprobs off by up to 32
nats after a sync that changed only the embedding). Small Qwen and Llama models
tie their embeddings.
"""

from __future__ import annotations

from typing import Any


class VfopsWorkerExtension:
    """Mixed into vLLM's worker class; reached through ``/collective_rpc``."""

    def vfops_load_weights(self, weights_path: str) -> bool:
        """vLLM's in-place reload from ``weights_path``, then refresh a tied LM head.

        Returns whether a tied head was refreshed.
        """
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is None or embed is None or head.weight is not embed.weight:
            return False
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)  # rebuilds what it derives
        return True
