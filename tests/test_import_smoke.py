"""``import vfops`` stays light: no torch, transformers, vllm or datasets."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm", "deepspeed", "datasets", "mlflow")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return {name.split(".")[0] for name in out.split()}


def test_import_vfops_loads_no_heavy_package() -> None:
    assert not loaded_after("import vfops; vfops.__version__") & set(HEAVY)


def test_cli_and_local_package_import_no_torch() -> None:
    loaded = loaded_after("import vfops.cli._app, vfops.local, vfops.clients, vfops.training")
    assert not loaded & {"torch", "transformers", "vllm", "deepspeed"}


def test_public_names_resolve_lazily() -> None:
    import vfops

    assert vfops.SingleTurnEnv.__name__ == "SingleTurnEnv"
    assert "Rubric" in dir(vfops)


def test_training_package_and_config_import_no_torch() -> None:
    loaded = loaded_after(
        "import vfops.training as t; t.load_config; t.config_help(); "
        "t.GRPOConfig(model={'path': 'm'}, environment={'id': 'e'}).run"
    )
    assert not loaded & {"torch", "transformers", "accelerate", "peft", "vllm", "deepspeed"}


def test_clients_run_without_the_openai_sdk() -> None:
    # A chat round trip (pool, request, decode) in a fresh process: the OpenAI
    # client speaks HTTP itself; the SDK costs ~0.4 s of start-up and ~1 ms a request.
    loaded = loaded_after(
        "import asyncio\n"
        "import vfops.clients as c\n"
        "from vfops.testing import StubServer\n"
        "async def main(url):\n"
        "    async with c.OpenAIClient(url, 'sk-x') as client:\n"
        "        r = await client.chat(model='m', messages=[{'role': 'user', 'content': 'hi'}])\n"
        "    assert r.message['content'] == 'ok', r\n"
        "with StubServer() as server:\n"
        "    asyncio.run(main(server.base_url))"
    )
    assert "aiohttp" in loaded  # the check below is not vacuous: the client did run
    assert not loaded & {"openai", "httpx", "httpx2", "httpx_aiohttp"}
