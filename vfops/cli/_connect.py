"""Turn ``--model`` / ``--base-url`` / ``--endpoints`` into a ready model client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vfops._errors import VfopsError
from vfops.clients._base import ModelClient

LOCAL_PREFIX = "local:"
MODEL_URI_PREFIX = "models:/"


@dataclass
class Connection:
    client: ModelClient
    model: str
    base_url: str | None


async def connect(
    model: str,
    *,
    base_url: str | None,
    api_key_var: str | None,
    endpoints_file: Path | None,
    timeout_s: float = 600.0,
    max_retries: int = 5,
) -> Connection:
    """Resolve the endpoint, read its key from the environment and check it is reachable."""
    if model.startswith(LOCAL_PREFIX):
        return _connect_local(model[len(LOCAL_PREFIX) :])
    if model.startswith(MODEL_URI_PREFIX):
        return await _connect_registry(model)
    from vfops.clients import OpenAIClient, check_reachable, read_api_key, resolve_endpoint

    endpoint = resolve_endpoint(
        model, endpoints_file=endpoints_file, base_url=base_url, api_key_var=api_key_var
    )
    # Required: a loopback server with the default variable unset gets "EMPTY".
    api_key = read_api_key(endpoint, required=True)
    await check_reachable(endpoint.base_url)
    client = OpenAIClient(endpoint.base_url, api_key, timeout_s=timeout_s, max_retries=max_retries)
    return Connection(client=client, model=endpoint.model, base_url=endpoint.base_url)


def _connect_local(model_dir: str) -> Connection:
    path = Path(model_dir).expanduser()
    if not (path / "config.json").exists():
        raise VfopsError(
            f"{path} is not a model directory (no config.json); build one with: "
            f"vfops model build-tiny {path}"
        )
    from vfops.local import LocalModelClient

    return Connection(client=LocalModelClient(path), model=f"local:{path.name}", base_url=None)


async def _connect_registry(uri: str) -> Connection:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` from MLflow, run in-process.

    The run records the pinned ``models:/NAME/VERSION``, so it can later serve as
    promotion evidence for that version.
    """
    from vfops.models._inprocess import open_model_version_async

    opened = await open_model_version_async(uri)
    return Connection(client=opened.client, model=opened.uri, base_url=None)
