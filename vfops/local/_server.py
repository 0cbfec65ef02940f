"""``vfops model serve``'s own server: a local model over OpenAI's chat API, in one process.

``python -m vfops.local._server DIR --host H --port P`` loads DIR once into a
:class:`~vfops.local.LocalModelClient` and answers ``GET /health``, ``GET /v1/models`` and ``POST
/v1/chat/completions`` (no streaming) on aiohttp. Concurrent requests share the client's
batched generator, so many rollouts of one eval are generated a batch at a time; ``n``
choices are ``n`` rows of one batch; ``logprobs: true`` gives each sampled token's
log-probability (OpenAI's ``choices[i].logprobs``), as the trainer reads it. The
``model`` of a request may be DIR's absolute path, its folder name, or any name the
server was started with (``--served-name``); another is a 404 naming them.

Errors are OpenAI's shape: bad sampling arguments or a content part the model cannot
take (an image for a text-only model) a 400 with the reason, any other failure a 500
with its one line (the traceback goes to the server's stderr, never to the client).
SIGTERM/SIGINT stop it after the requests in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from vfops._errors import InvalidArgumentError

__all__ = ["main", "make_app"]

_SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens",
    "max_completion_tokens", "seed", "stop", "logprobs", "top_logprobs",
)  # fmt: skip


def _error(status: int, message: str, type_: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": None}}
    return web.json_response(body, status=status)


class _Server:
    def __init__(self, client: Any, names: list[str]) -> None:
        self.client = client
        self.names = names
        self.created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": name, "object": "model", "created": self.created, "owned_by": "vfops"}
            for name in self.names
        ]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "a chat completion needs 'messages' (a list)")
        model = body.get("model")
        if model not in self.names:
            return _error(
                404,
                f"model {model!r} is not served here; use one of {', '.join(self.names)}",
                "not_found_error",
            )
        if body.get("stream"):
            return _error(400, "stream=true is not supported by vfops model serve; drop it")
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1:
            return _error(400, "n must be an integer >= 1")
        sampling = {k: body[k] for k in _SAMPLING_KEYS if body.get(k) is not None}
        seed = sampling.pop("seed", None)
        try:
            # n rows: concurrent, so the batched generator samples them together; a seed
            # makes each reproducible (choice i draws with seed + i)
            answers = await asyncio.gather(
                *(
                    self.client.chat(
                        model=model,
                        messages=body["messages"],
                        sampling_args={**sampling, **({} if seed is None else {"seed": seed + i})},
                        tools=body.get("tools"),
                    )
                    for i in range(n)
                )
            )
        except InvalidArgumentError as exc:
            return _error(400, str(exc))
        except Exception as exc:  # the client gets one line, the operator the traceback
            traceback.print_exc()
            return _error(500, f"the model failed: {type(exc).__name__}: {exc}", "server_error")
        return web.json_response(self._completion(model, answers))

    def _completion(self, model: str, answers: list[Any]) -> dict[str, Any]:
        choices = []
        for index, answer in enumerate(answers):
            choice: dict[str, Any] = {
                "index": index,
                "message": dict(answer.message),
                "finish_reason": answer.finish_reason,
                "logprobs": (answer.raw or {}).get("logprobs"),
            }
            choices.append(choice)
        prompt = answers[0].prompt_tokens or 0
        completion = sum(a.completion_tokens or 0 for a in answers)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }


def make_app(client: Any, names: list[str]) -> web.Application:
    """The server's application over ``client`` (a :class:`LocalModelClient`), answering
    requests for any of ``names``."""
    server = _Server(client, names)
    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_get("/health", server.health)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    return app


async def _serve(args: argparse.Namespace, path: Path) -> None:
    from vfops.local._client import LocalModelClient

    client = LocalModelClient(
        path, max_new_tokens_default=args.max_tokens, max_batch_size=args.max_batch_size
    )
    names = [str(path), path.name, *args.served_name]
    runner = web.AppRunner(make_app(client, names), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"ready: http://{args.host}:{args.port}/v1", flush=True)
    await stop.wait()
    await runner.cleanup()  # the requests in flight are answered first
    await client.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vfops.local._server")
    parser.add_argument("directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-name", action="append", default=[])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    asyncio.run(_serve(args, Path(args.directory).resolve()))


if __name__ == "__main__":
    main()
