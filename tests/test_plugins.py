"""A plug-in package of its own (examples/vfops_plugin_example), installed with pip into a
folder of its own, adds an eval sink, a request middleware and a loss variant that
``vfops eval --sink``/``--middleware`` and a training config use by name, with no edit to
vfops: the sink is opened with the run's id and the environment's content hash (the
registry's) and gets every rollout; every request carries the middleware's header.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web

from tests.http_fixtures import loopback_server
from vfops.testing import StubConfig, StubServer

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "vfops_plugin_example"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(PLUGIN)],
        check=True, capture_output=True,
    )  # fmt: skip
    return site


def env_with(site: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VFOPS_DATABASE_URL"}
    return {**env, "PYTHONPATH": str(site), "VFOPS_HOME": str(tmp_path / "home"),
            "VFOPS_TRACKING": "0"}  # fmt: skip


def test_a_plugin_sink_gets_the_run_and_every_rollout(plugin_site: Path, tmp_path: Path) -> None:
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        done = subprocess.run(
            [sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", "stub-model",
             "-b", stub.base_url, "-n", "4", "-r", "2", "--sink", "csv",
             "-o", str(tmp_path / "out"), "-q"],
            env=env_with(plugin_site, tmp_path), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (metadata_file,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    metadata = json.loads(metadata_file.read_text())
    with (metadata_file.parent / "rollouts.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    head, columns, *rollouts, end = rows
    assert head[1] == metadata["run_id"] and head[2] == "arithmetic"
    assert head[4] == metadata["env_code_hash"] and len(head[4]) >= 12
    assert columns == ["example_id", "rollout_index", "reward", "error"]
    assert len(rollouts) == 8 and end == ["# status", "completed"]


async def test_a_plugin_middleware_wraps_every_request(plugin_site: Path, tmp_path: Path) -> None:
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-Experiment"))
        body = await request.json()
        reply = {"role": "assistant", "content": "4"}
        return web.json_response({
            "id": "c", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        })  # fmt: skip

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    routes = {("POST", "/v1/chat/completions"): chat, ("GET", "/v1/models"): models}
    async with loopback_server(routes) as base_url:
        env = {**env_with(plugin_site, tmp_path), "VFOPS_EXPERIMENT": "exp-42"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", "m", "-b", base_url,
            "-n", "3", "-r", "2", "--middleware", "run-header", "-o", str(tmp_path / "out"),
            "-q", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert len(seen) == 6 and set(seen) == {"exp-42"}


def test_an_unknown_sink_is_one_line_before_anything_starts(
    plugin_site: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", "stub-model",
         "-b", "http://127.0.0.1:9/v1", "--sink", "parquet", "-o", str(tmp_path / "out")],
        env=env_with(plugin_site, tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --sink: no sink named 'parquet'; installed: csv")
    assert not (tmp_path / "out").exists()


def test_a_plugin_loss_trains_by_name(plugin_site: Path, tmp_path: Path) -> None:
    config = (ROOT / "configs" / "train" / "cpu_lucky_digit.toml").read_text()
    config = config.replace('type = "grpo"', 'type = "half_dapo"')
    assert 'type = "half_dapo"' in config
    config = config.replace("../../.vfops-train", str(tmp_path / "work"))
    (tmp_path / "half.toml").write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "vfops", "train", str(tmp_path / "half.toml"), "--steps", "2",
         "--no-tracking", "--output-dir", str(tmp_path / "run")],
        env=env_with(plugin_site, tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step 2/2" in done.stdout + done.stderr
    saved = (tmp_path / "run" / "final").exists() or any((tmp_path / "run").iterdir())
    assert saved


def test_vfops_own_sinks_are_entry_points_listed_like_any_other() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vfops", "plugins"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    sinks = done.stdout.split("vfops.eval_sinks:")[1].split("vfops.request_middleware")[0]
    for name in ("arrow", "registry", "mlflow"):
        assert f"  {name} " in sinks and "vfops.evaluation._default_sinks:" in sinks


def test_a_built_in_sink_named_again_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vfops", "eval", "arithmetic", "-m", "stub-model",
         "-b", "http://127.0.0.1:9/v1", "--sink", "registry", "-o", str(tmp_path), "-q"],
        env={**os.environ, "VFOPS_HOME": str(tmp_path / "home")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "'registry' is one of vfops's own sinks" in line
    assert not (tmp_path / "evals").exists() and not (tmp_path / "home").exists()


_MADE: list[object] = []


def replaced_arrow(info: object) -> object:
    """A stand-in for vfops's own ``arrow`` entry point (the test below)."""
    from vfops.evaluation import RunFinish

    _MADE.append(info)

    class Counting:
        name = "counting"
        groups = 0

        async def write_group(self, records: list[object]) -> None:
            Counting.groups += 1

        async def close(self, finish: RunFinish) -> None:
            _MADE.append(("closed", finish.status, Counting.groups))

    return Counting()


replaced_arrow.opens_at_start = True  # type: ignore[attr-defined]


def test_the_built_in_sinks_are_found_through_their_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Point the ``arrow`` entry point elsewhere: the run builds that sink instead, with
    the run's info, and no rollouts.arrow is written (no other path makes it)."""
    from importlib.metadata import EntryPoint

    import vfops.evaluation._default_sinks as default_sinks
    from vfops.evaluation import EvalRequest, ModelOptions, RunInfo, RunOptions, evaluate

    real = default_sinks.entry_points

    def patched(*, group: str) -> list[EntryPoint]:
        found = [ep for ep in real(group=group) if ep.name != "arrow"]
        return [*found, EntryPoint("arrow", f"{__name__}:replaced_arrow", group)]

    monkeypatch.setattr(default_sinks, "entry_points", patched)
    _MADE.clear()
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        request = EvalRequest(
            env_name="arithmetic", model="stub-model", num_examples=3, rollouts_per_example=2
        )
        result = evaluate(
            request,
            RunOptions(registry=False, tracking=False, output_root=tmp_path),
            model_options=ModelOptions(base_url=stub.base_url),
        )
    assert result.status == "completed"
    info, closed = _MADE
    assert isinstance(info, RunInfo) and info.run_dir == result.run_dir
    assert info.env_name == "arithmetic" and info.model == "stub-model"
    assert closed == ("closed", "completed", 3)
    assert not (result.run_dir / "rollouts.arrow").exists()
