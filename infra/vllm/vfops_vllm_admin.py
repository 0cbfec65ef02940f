"""The two admin calls GRPO training makes to vLLM, without vLLM's dev mode.

vLLM's weight reload (``/collective_rpc``) and cache reset (``/reset_prefix_cache``)
exist only in its development mode, which also serves ``/sleep``, ``/server_info``,
``/pause`` and a ``/collective_rpc`` that runs any worker method, all without
authentication. infra/ never turns that mode on. vLLM loads this ASGI middleware
instead (``--middleware=vfops_vllm_admin.AdminRoutes``, this folder on
``PYTHONPATH``); it answers exactly:

- ``POST /collective_rpc`` with ``{"method": "vfops_load_weights", "kwargs":
  {"weights_path": DIR}}`` and DIR inside ``$VFOPS_VLLM_SYNC_DIR`` (the trainer's
  filesystem weight sync; vfops' worker extension does the load);
- ``POST /reset_prefix_cache?reset_running_requests=true|false``;

each only with ``Authorization: Bearer $VLLM_API_KEY``, the key vLLM itself requires
on ``/v1`` (the trainer sends it: ``[generation] api_key_var = "VLLM_API_KEY"``). Every
other path goes to vLLM unchanged. NCCL weight transfer (``sync = "nccl"``) needs
vLLM's own weight-transfer routes, which are not served here: use filesystem sync.

Imports only Starlette (a vLLM dependency), never vLLM, so it is tested without it
(tests/test_infra.py).
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = ["AdminRoutes"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RELOAD_METHOD = "vfops_load_weights"


def _required(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        # raised while vLLM builds its app: the server does not start
        raise RuntimeError(
            f"vfops_vllm_admin: {name} is not set; the admin routes need it "
            "(infra/README.md, GPU profile)"
        )
    return value


def _inside(path: str, folder: Path) -> bool:
    """Whether ``path`` (links and ``..`` resolved) lies in ``folder``."""
    return Path(path).resolve().is_relative_to(folder)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


class AdminRoutes:
    """ASGI middleware serving the reload and cache-reset routes behind the API key."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._key = _required("VLLM_API_KEY").encode()
        self._sync_dir = Path(_required("VFOPS_VLLM_SYNC_DIR")).resolve()
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", "/collective_rpc"): self._reload,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http":
            handler = self._routes.get((scope["method"], scope["path"]))
        if handler is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        if not self._authorized(request):
            response: Response = _error(401, "Unauthorized")
        else:
            response = await handler(request)
        await response(scope, receive, send)

    def _authorized(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), self._key)

    async def _reload(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict) or body.get("method") != RELOAD_METHOD:
            return _error(403, f"only {RELOAD_METHOD} may be called here")
        kwargs = body.get("kwargs")
        if not isinstance(kwargs, dict) or set(kwargs) != {"weights_path"}:
            return _error(400, f"{RELOAD_METHOD} takes kwargs {{'weights_path': DIR}} only")
        path = kwargs["weights_path"]
        if not isinstance(path, str):
            return _error(400, f"{RELOAD_METHOD} takes kwargs {{'weights_path': DIR}} only")
        if not _inside(path, self._sync_dir):
            return _error(403, f"weights_path must be inside {self._sync_dir}")
        timeout = body.get("timeout")
        results = await request.app.state.engine_client.collective_rpc(
            method=RELOAD_METHOD,
            timeout=timeout if isinstance(timeout, int | float) else None,
            args=(),
            kwargs={"weights_path": path},
        )
        return JSONResponse({"results": [r if r is None else str(r) for r in results or []]})

    async def _reset_prefix_cache(self, request: Request) -> Response:
        running = request.query_params.get("reset_running_requests", "false").lower() == "true"
        success = await request.app.state.engine_client.reset_prefix_cache(running)
        return JSONResponse({"success": bool(success)})
