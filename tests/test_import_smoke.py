"""``import vfops`` stays light: no torch, transformers, vllm or datasets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(("env_name", "size"), [("arithmetic", 1000), ("mixed", 1200)])
def test_eval_of_plain_rows_imports_no_datasets(env_name: str, size: int, tmp_path: Path) -> None:
    # These builders return plain rows (mixed: an EnvGroup of two such environments):
    # vfops eval's whole path (load, size, examples, rollouts, the run folder's Arrow
    # export) must leave datasets unimported, about a second of start-up, and pandas
    # too (pyarrow imports it on its first conversion of Python objects: the export
    # goes through pyarrow's JSON reader instead).
    loaded = loaded_after(
        "import asyncio\n"
        "from pathlib import Path\n"
        "from vfops.clients import ScriptedClient\n"
        "from vfops.envs import load_environment\n"
        "from vfops.evaluation import EvalRequest, RunOptions, evaluate_async\n"
        f"env = load_environment({env_name!r})\n"
        "examples = list(env.iter_eval_examples(3))\n"
        "assert len(examples) == 3 and examples[0].answer, examples\n"
        f"assert env.eval_size() == {size}, env.eval_size()\n"
        f"request = EvalRequest(env_name={env_name!r}, model='m', num_examples=3,"
        " rollouts_per_example=2)\n"
        "client = ScriptedClient(['<answer>1</answer>'], cycle=True)\n"
        "result = asyncio.run(evaluate_async(request, RunOptions("
        f"output_root=Path({str(tmp_path)!r}), registry=False), environment=env, client=client))\n"
        "assert result.status == 'completed' and result.summary.rollouts == 6, result\n"
    )
    assert {env_name, "pyarrow"} <= loaded  # not vacuous: the environment ran and exported
    assert not loaded & {"datasets", "pandas"}


def test_a_command_imports_only_its_own_cli_module() -> None:
    # vfops eval builds an app of that one command: the other command modules (and
    # what they import) stay out of its start-up
    code = (
        "import sys\n"
        "sys.argv = ['vfops', 'eval', '--help']\n"
        "from vfops.cli._app import run\n"
        "try:\n"
        "    run()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('vfops.cli.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    modules = set(out.strip().splitlines()[-1].split())
    assert "vfops.cli._eval" in modules and "Usage: vfops eval" in out
    others = {"_deploy", "_promote", "_train", "_model", "_runs", "_db", "_vllm", "_env", "_stack"}
    assert not modules & {f"vfops.cli.{name}" for name in others}


@pytest.mark.parametrize("registry", ["--no-registry", "--registry"])
def test_a_piped_eval_imports_neither_rich_nor_pydantic(registry: str, tmp_path: Path) -> None:
    # Off a terminal there is no progress bar and the summary is plain text: rich's
    # import (~60-100 ms) would sit between the last rollout and the exit. pydantic
    # (~0.1 s) is for config files; an eval without one (and its provenance record,
    # typer's parsing of its flags, the check of -k's variable name) does not need it.
    code = (
        "import contextlib, io, os, sys\n"
        f"os.environ.update(VFOPS_HOME={str(tmp_path / 'home')!r}, VFOPS_TRACKING='0',"
        " STUB_KEY='k')\n"
        "from vfops.testing import StubConfig, StubServer\n"
        "with StubServer(StubConfig(reply_mode='arithmetic')) as server:\n"
        "    sys.argv = ['vfops', 'eval', 'arithmetic', '-m', 'stub-model', '-b',\n"
        f"        server.base_url, '-k', 'STUB_KEY', '-n', '3', '-r', '1', {registry!r},\n"
        f"        '-o', {str(tmp_path)!r}]\n"
        "    from vfops.cli._app import run\n"
        "    out = io.StringIO()\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out):\n"
        "        run()\n"
        "print(out.getvalue())\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "pass@1" in out and "rollouts" in out  # the eval ran and printed its summary
    assert ("run: " in out) == (registry == "--registry"), out  # recorded where asked
    loaded = set(out.strip().splitlines()[-1].split())
    assert not loaded & {"rich", "pydantic"}
    # the registry's work runs in its own process (vfops.registry._service):
    # SQLAlchemy's import and the inserts never take the event loop's GIL
    assert "sqlalchemy" not in loaded


def test_the_registry_side_loads_no_http_client() -> None:
    # The registry operations of `vfops eval` run in its tracker process, which
    # unpickles their arguments (rollouts, leases, a run's opening): the modules that
    # serves and those values' must not load aiohttp (the whole client stack: ~9 MB of
    # the tracker, bar 3a's process tree).
    loaded = loaded_after(
        "import vfops.registry._service, vfops.registry._run_ops, vfops._rollout, "
        "vfops._lease, vfops.costs._ledger, vfops.tracking._eval_runs"
    )
    assert "vfops" in loaded
    assert "aiohttp" not in loaded
