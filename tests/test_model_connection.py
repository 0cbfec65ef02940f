"""``connect_model``: the model-name check against the endpoint's ``GET /models``,
and the retry options reaching the client, over real HTTP."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from tests.http_fixtures import Handler, loopback_server
from vfops._errors import EndpointError
from vfops.clients import MalformedResponseError, NotFoundError, OpenAIClient
from vfops.evaluation import ModelOptions, _model
from vfops.evaluation._model import connect_model
from vfops.testing import StubConfig, StubServer


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_served_model_connects_and_the_options_reach_the_client() -> None:
    with StubServer(StubConfig(model_name="tiny")) as server:
        options = ModelOptions(base_url=server.base_url, max_retries=2, max_retry_wait_s=7.5)
        connection = await connect_model("tiny", options)
        try:
            response = await connection.client.chat(model="tiny", messages=_user("ANSWER_HINT: 3"))
        finally:
            await connection.client.aclose()
    assert response.message["content"] == "<answer>3</answer>"
    assert isinstance(connection.client, OpenAIClient)
    assert (connection.client.retry.max_retries, connection.client.retry.max_retry_wait_s) == (
        2,
        7.5,
    )


async def test_an_unknown_model_fails_before_the_run_naming_the_served_ones() -> None:
    with StubServer(StubConfig(model_name="tiny-chat")) as server:
        with pytest.raises(EndpointError) as info:
            await connect_model("tiny-caht", ModelOptions(base_url=server.base_url))
        assert server.stats["requests"] == 0  # no chat request was sent
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"model 'tiny-caht' is not served at {server.base_url}; it serves tiny-chat; "
        "pass one of them with -m"
    )


async def test_an_alias_names_its_model_and_the_closest_served_ones_come_first(
    tmp_path: Path,
) -> None:
    served = [f"org/model-{i:02d}" for i in range(30)] + ["qwen3-8b-instruct"]
    async with _models_server(served) as url:
        endpoints = tmp_path / "endpoints.toml"
        endpoints.write_text(
            f'[[endpoint]]\nalias = "small"\nmodel = "qwen3-8b"\nbase_url = "{url}"\n'
        )
        with pytest.raises(EndpointError) as info:
            await connect_model("small", ModelOptions(endpoints_file=endpoints))
    message = str(info.value)
    assert message.startswith(
        f"model 'qwen3-8b' (alias 'small') is not served at {url}; it serves qwen3-8b-instruct, "
    )
    assert " and 11 more; " in message  # 20 shown of 31


@pytest.mark.parametrize("status", [404, 401, 403, 405, 500])
async def test_an_endpoint_without_a_model_list_is_not_checked(status: int) -> None:
    """No /models route, or one that needs other rights: proceed; the rollouts then
    carry the server's own explanation."""
    config = StubConfig(models_status=status, reject_unknown_model=True)
    with StubServer(config) as server:
        connection = await connect_model("other-model", ModelOptions(base_url=server.base_url))
        try:
            with pytest.raises(NotFoundError) as info:
                await connection.client.chat(model="other-model", messages=_user("x"))
        finally:
            await connection.client.aclose()
    assert str(info.value) == (
        "HTTP 404 Not Found: The model `other-model` does not exist or you do not have access "
        "to it. (code: model_not_found)"
    )


async def test_the_check_sends_the_key_and_a_wrong_key_skips_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with StubServer(StubConfig(model_name="tiny", api_key="sk-right")) as server:
        options = ModelOptions(base_url=server.base_url, api_key_var="VFOPS_TEST_KEY")
        monkeypatch.setenv("VFOPS_TEST_KEY", "sk-right")
        with pytest.raises(EndpointError, match="it serves tiny;"):
            await connect_model("other", options)
        monkeypatch.setenv("VFOPS_TEST_KEY", "sk-wrong")  # 401 on /models: the run will tell
        connection = await connect_model("other", options)
        await connection.client.aclose()


async def test_the_check_can_be_turned_off() -> None:
    with StubServer(StubConfig(model_name="tiny")) as server:
        connection = await connect_model(
            "not-listed", ModelOptions(base_url=server.base_url, check_model=False)
        )
        await connection.client.aclose()
    assert connection.model == "not-listed"


async def test_a_slow_or_odd_model_list_skips_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_model, "MODEL_LIST_TIMEOUT_S", 0.2)
    answer_the_list = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await answer_the_list.wait()  # only once the connection is made: never in time
        return web.json_response({"data": [{"id": "tiny"}]})

    async def odd(request: web.Request) -> web.Response:
        return web.json_response({"models": ["tiny"]})

    async def empty(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    for handler in (slow, odd, empty):
        async with _server(handler) as url:
            try:  # a check that waited for the slow list would never return (60 s: a net)
                connection = await asyncio.wait_for(
                    connect_model("other", ModelOptions(base_url=url)), timeout=60
                )
            finally:
                answer_the_list.set()
            await connection.client.aclose()


async def test_an_ollama_name_without_its_tag_is_served() -> None:
    async with _models_server(["llama3:latest", "qwen2:7b"]) as url:
        connection = await connect_model("llama3", ModelOptions(base_url=url))
        await connection.client.aclose()
        with pytest.raises(EndpointError, match="it serves qwen2:7b, llama3:latest;"):
            await connect_model("qwen2", ModelOptions(base_url=url))


async def test_list_models_raises_on_a_body_that_is_not_a_model_list() -> None:
    async def odd(request: web.Request) -> web.Response:
        return web.Response(body=b"[1, 2]", content_type="application/json")

    async with _server(odd) as url, OpenAIClient(url) as client:
        with pytest.raises(MalformedResponseError, match="not a model list"):
            await client.list_models()


# --------------------------------------------------------------------------- helpers


def _models_server(models: list[str]) -> AbstractAsyncContextManager[str]:
    async def handler(request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model"} for name in models]
        return web.Response(
            body=orjson.dumps({"object": "list", "data": data}), content_type="application/json"
        )

    return _server(handler)


def _server(models_handler: Handler) -> AbstractAsyncContextManager[str]:
    """A real HTTP server on loopback answering ``GET /v1/models``; yields its base URL."""
    return loopback_server({("GET", "/v1/models"): models_handler})
