"""A fake vLLM OpenAI server for the vLLM backend's tests (tests/test_training_vllm.py and
the v1 adapter's, tests/v1): the routes the backend uses, each request recorded; its
completions are the token ids a test scripts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from vfops._net import free_port

MODEL_NAME = "tiny"


@dataclass
class FakeVLLM:
    """Records requests; completions come from ``script`` (token ids to return)."""

    script: list[list[int]] = field(default_factory=list)
    requests: list[tuple[str, Any]] = field(default_factory=list)
    reload_status: int = 200
    reloaded: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def bodies(self, path: str) -> list[Any]:
        return [b for p, b in self.requests if p == path]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/collective_rpc", self.collective_rpc)
        app.router.add_post("/reset_prefix_cache", self.reset)
        app.router.add_get("/get_world_size", self.get_world_size)
        for route in (
            "init_weight_transfer_engine",
            "start_weight_update",
            "update_weights",
            "finish_weight_update",
            "shutdown_weight_transfer_engine",
        ):
            app.router.add_post(f"/{route}", self.weight_route)
        return app

    async def _record(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        path = request.path
        if request.query_string:
            path = f"{path}?{request.query_string}"
        self.requests.append((path, body))
        return body

    async def models(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"object": "list", "data": [{"id": MODEL_NAME}]})

    async def completions(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if body["model"] != MODEL_NAME:
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        ids = self.script.pop(0)
        logprobs = [-0.25 * (i + 1) for i in range(len(ids))]
        choice = {
            "index": 0,
            "text": "ignored by the client",
            "logprobs": {
                "tokens": [f"token_id:{i}" for i in ids],
                "token_logprobs": logprobs,
                "top_logprobs": [
                    {f"token_id:{i}": lp} for i, lp in zip(ids, logprobs, strict=True)
                ],
                "text_offset": list(range(len(ids))),
            },
            "finish_reason": "stop",
            "token_ids": ids,
            "prompt_token_ids": body["prompt"],
        }
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}
        return web.json_response({"choices": [choice], "usage": usage})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        from safetensors.torch import load_file

        body = await self._record(request)
        if self.reload_status != 200:
            message = "Call to collective_rpc method failed: Worker failed with error 'boom'"
            return web.json_response(
                {"error": {"message": message, "type": "InternalServerError", "code": 500}},
                status=self.reload_status,
            )
        path = Path(body["kwargs"]["weights_path"])
        # Load now: the backend deletes this version's directory at the next sync.
        self.reloaded = {
            "path": path,
            "tensors": load_file(str(path / "model.safetensors")),
            "config": (path / "config.json").is_file(),
        }
        return web.json_response({"results": [None]})

    async def reset(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"success": True})

    async def get_world_size(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"world_size": self.world_size})

    async def weight_route(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"message": "ok"})


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeVLLM, str]]:
    server = FakeVLLM()
    runner = web.AppRunner(server.app())
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
