"""Weight sync into a vLLM server, after each optimizer step.

Light module at import (torch, safetensors and vllm load inside functions). Two ways,
``[generation] sync``:

- ``filesystem``: the model is saved as safetensors (+ config) under ``sync_dir``,
  the server reloads in place through ``POST /collective_rpc`` with vLLM's own
  ``vfops_load_weights(weights_path=...)`` (vfops' worker extension,
  :mod:`vfops.training._vllm_worker`; dev-mode endpoint), then ``POST
  /reset_prefix_cache``. Works on the CPU build of vLLM too.
- ``nccl``: vLLM's native weight-transfer API (server started with
  ``--weight-transfer-config '{"backend": "nccl"}'``): once, ``/init_weight_transfer_engine``
  while this process joins the NCCL group as rank 0; each sync,
  ``/start_weight_update``, ``/update_weights`` (names, dtypes, shapes) while every
  parameter is broadcast, ``/finish_weight_update``, ``/reset_prefix_cache``.
  Needs ``vllm`` importable in the trainer's Python and a CUDA device.

Kept apart from generation (:mod:`vfops.training._vllm`): the data plane (NCCL, the
sync folder) has its own lifecycle and failure modes, and tests replace it
(``nccl_channel``) without touching the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from vfops._net import free_port
from vfops.training._vllm_server import VLLMBackendError, VLLMGenerationConfig, VLLMServer

if TYPE_CHECKING:
    import torch


def _save_weights(model: torch.nn.Module, target: Path) -> None:
    """Write ``model`` as a checkpoint directory vLLM can load (atomically renamed)."""
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_pretrained = getattr(model, "save_pretrained", None)
    if hasattr(model, "merge_adapter"):
        # a peft model: its save_pretrained writes the adapters only, under peft's names
        # (base_model.model...), which the server's model does not have. The merged
        # weights under the base model's names instead; a tied head once, as
        # save_pretrained leaves it.
        from safetensors.torch import save_file

        from vfops.training._weights import full_state_dict

        weights = full_state_dict(model)
        base: Any = model.get_base_model()  # type: ignore[operator]
        if getattr(base.config, "tie_word_embeddings", False):
            weights.pop("lm_head.weight", None)
        save_file(weights, str(tmp / "model.safetensors"))
        base.config.save_pretrained(str(tmp))
    elif callable(save_pretrained):
        # Hugging Face models: checkpoint names, tied weights dropped, config.json.
        from vfops.local import quiet_progress

        with quiet_progress():
            save_pretrained(str(tmp), max_shard_size="1000GB")
    else:
        from safetensors.torch import save_model

        save_model(model, str(tmp / "model.safetensors"))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def _named_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Checkpoint-named parameters, each shared tensor once (tied embeddings)."""
    return [(name, p.detach()) for name, p in model.named_parameters()]


class NcclChannel(Protocol):
    """The trainer's end (rank 0) of the NCCL group with the vLLM workers."""

    def broadcast(self, tensors: list[torch.Tensor]) -> None: ...

    def close(self) -> None: ...


ChannelFactory = Callable[[str, int, int, "torch.device"], NcclChannel]
"""(master address, master port, world size, device) -> an open channel (blocks
until every vLLM worker has joined)."""


class _PyNcclChannel:
    def __init__(self, group: Any) -> None:
        self._group = group

    def broadcast(self, tensors: list[torch.Tensor]) -> None:
        import torch

        stream = torch.cuda.current_stream()
        for tensor in tensors:
            # NCCL sends numel elements from data_ptr(): never a strided view.
            self._group.broadcast(tensor.contiguous(), src=0, stream=stream)
        stream.synchronize()

    def close(self) -> None:
        destroy = getattr(self._group, "destroy", None)
        if callable(destroy):
            destroy()


def open_vllm_nccl_channel(
    address: str, port: int, world_size: int, device: torch.device
) -> NcclChannel:
    """Join vLLM's weight-transfer NCCL group as rank 0 (needs ``vllm`` and CUDA)."""
    import torch

    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        raise VLLMBackendError(
            "generation.sync='nccl' needs vllm importable in the trainer's Python "
            "(pip install vllm in its venv), or use sync='filesystem'"
        ) from exc
    if device.type != "cuda":
        raise VLLMBackendError(
            f"generation.sync='nccl' needs the model on a CUDA device (it is on {device}); "
            "use sync='filesystem'"
        )
    torch.cuda.set_device(device)
    group: Any
    try:  # vLLM >= 0.2x: the helper its own trainer engine uses
        common: Any = importlib.import_module("vllm.distributed.weight_transfer.nccl_common")
        group = common.trainer_init(
            {"master_address": address, "master_port": port, "world_size": world_size}
        )
    except (ImportError, AttributeError):  # older vLLM: the TRL-era pattern
        pynccl: Any = importlib.import_module("vllm.distributed.device_communicators.pynccl")
        utils: Any = importlib.import_module("vllm.distributed.utils")
        pg = utils.StatelessProcessGroup.create(
            host=address, port=port, rank=0, world_size=world_size
        )
        group = pynccl.PyNcclCommunicator(pg, device=device)
    return _PyNcclChannel(group)


class WeightSync:
    """Loads the trainer's weights into the server ``config.sync`` names.

    ``nccl_channel`` replaces the NCCL data plane (tests). Owns the sync folder when
    ``config.sync_dir`` is empty (a new temporary one, removed by :meth:`aclose`) and
    the NCCL channel once opened.
    """

    def __init__(
        self,
        config: VLLMGenerationConfig,
        server: VLLMServer,
        nccl_channel: ChannelFactory | None = None,
    ) -> None:
        self.config = config
        self.server = server
        self._sync_dir, self._own_sync_dir = _make_sync_dir(config)
        self._last_dir: Path | None = None
        self._open_channel: ChannelFactory = nccl_channel or open_vllm_nccl_channel
        self._channel: NcclChannel | None = None

    async def load(self, model: torch.nn.Module, version: int) -> None:
        """Make the server generate with ``model``'s weights (its prefix cache reset)."""
        if self.config.sync == "filesystem":
            await self._sync_filesystem(model, version)
        else:
            await self._sync_nccl(model, version)
        await self._reset_prefix_cache()

    async def _sync_filesystem(self, model: torch.nn.Module, version: int) -> None:
        assert self._sync_dir is not None
        target = self._sync_dir / f"policy-{version:08d}"
        try:
            await asyncio.to_thread(_save_weights, model, target)
        except OSError as exc:
            raise VLLMBackendError(
                f"cannot write weights to {str(target)!r} ({exc.strerror or exc}); "
                "check generation.sync_dir has room and is writable"
            ) from exc
        await self.server.admin(
            "POST",
            "/collective_rpc",
            # Only string arguments cross this endpoint (vLLM's rule).
            # vfops' worker extension (vfops vllm serve installs it): vLLM's own
            # reload_weights leaves a tied LM head on the old weights
            {"method": "vfops_load_weights", "kwargs": {"weights_path": str(target)}},
            what=f"vfops_load_weights from {target}",
            fix="start the server with `vfops vllm serve` (it adds the vfops worker "
            "extension), and check it can read generation.sync_dir",
        )
        previous, self._last_dir = self._last_dir, target
        if previous is not None and previous != target:
            shutil.rmtree(previous, ignore_errors=True)

    async def _sync_nccl(self, model: torch.nn.Module, version: int) -> None:
        weights = _named_weights(model)
        if not weights:
            raise VLLMBackendError("the model has no parameters to sync")
        channel = self._channel or await self._init_nccl(weights[0][1].device)
        update_info = {
            "names": [name for name, _ in weights],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
            "shapes": [list(t.shape) for _, t in weights],
        }
        await self.server.admin("POST", "/start_weight_update", what="start_weight_update")
        # The workers receive inside /update_weights: it must be in flight while
        # this process broadcasts (both meet in the same NCCL calls).
        receive = asyncio.ensure_future(
            self.server.admin(
                "POST", "/update_weights", {"update_info": update_info}, what="update_weights"
            )
        )
        try:
            await asyncio.to_thread(channel.broadcast, [t for _, t in weights])
        except BaseException:
            receive.cancel()
            raise
        await receive
        await self.server.admin(
            "POST",
            "/finish_weight_update",
            {"weight_version": str(version)},
            what="finish_weight_update",
        )

    async def _init_nccl(self, device: torch.device) -> NcclChannel:
        info = await self.server.admin(
            "GET",
            "/get_world_size?include_dp=true",
            what="get_world_size",
            fix="start the server with `vfops vllm serve --sync nccl`",
        )
        world_size = 1 + int(info["world_size"])
        address = self.config.nccl_master_address
        port = self.config.nccl_master_port or free_port(address=address)
        init = self.server.admin(
            "POST",
            "/init_weight_transfer_engine",
            {
                "init_info": {
                    "master_address": address,
                    "master_port": port,
                    "rank_offset": 1,
                    "world_size": world_size,
                    "packed": False,
                }
            },
            what="init_weight_transfer_engine",
            fix="start the server with `vfops vllm serve --sync nccl`",
        )
        # Workers block in the rendezvous until this process joins: run both at once.
        results = await asyncio.gather(
            init,
            asyncio.to_thread(self._open_channel, address, port, world_size, device),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                channel = results[1]
                if not isinstance(channel, BaseException):
                    channel.close()
                raise result
        channel = results[1]
        assert not isinstance(channel, BaseException)
        self._channel = channel
        return channel

    async def _reset_prefix_cache(self) -> None:
        """Cached KV of shared prefixes was computed by the old weights: drop it."""
        for running in ("false", "true"):
            # Fails while running requests hold blocks; the second try resets
            # those too (they are recomputed with the new weights).
            data = await self.server.admin(
                "POST",
                f"/reset_prefix_cache?reset_running_requests={running}",
                what="reset_prefix_cache",
            )
            if not isinstance(data, dict) or data.get("success", True):
                return
        raise VLLMBackendError(
            f"vLLM server at {self.server.root} could not reset its prefix cache after a "
            "weight sync; check the server log"
        )

    async def close_channel(self) -> None:
        """Leave the NCCL group (the server's weight-transfer engine is shut down first)."""
        channel, self._channel = self._channel, None
        if channel is not None:
            with contextlib.suppress(VLLMBackendError):
                await self.server.admin("POST", "/shutdown_weight_transfer_engine", what="shutdown")
            channel.close()

    def remove_own_sync_dir(self) -> None:
        """Delete the sync folder if this object made it (a temporary one)."""
        if self._own_sync_dir and self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)


def _make_sync_dir(config: VLLMGenerationConfig) -> tuple[Path | None, bool]:
    """(the sync folder, whether it is a temporary one made here); None for nccl."""
    if config.sync != "filesystem":
        return None, False
    if not config.sync_dir:
        import tempfile

        return Path(tempfile.mkdtemp(prefix="vfops-vllm-sync-")), True
    path = Path(config.sync_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VLLMBackendError(
            f"generation.sync_dir {str(path)!r} cannot be created ({exc.strerror}); "
            "pick a writable directory the server can read"
        ) from exc
    return path, False
