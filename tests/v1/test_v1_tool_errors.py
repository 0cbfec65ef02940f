"""A v1 taskset whose tool server fails every call (``v1_broken_tool``): every rollout
scores 0, and the run must say why — its summary names the failed tool calls in one line,
the registry and the rows count them, and ``--max-tool-error-rate`` fails the run (exit 3)
when asked. A run that went wrong never reads as a weak model's.

Run in .venv-v1 (``make test-v1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from vfops.testing import StubConfig, StubServer

VFOPS = str(Path(sys.executable).parent / "vfops")


def calls_the_tool(request: dict[str, Any]) -> dict[str, Any]:
    """Call the offered tool once with the quoted key; then repeat what it answered."""
    messages = request["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return {"role": "assistant", "content": f"the tool said: {last['content']}"}
    tools = request.get("tools") or []
    key = str(last.get("content") or "").split('"')[1]
    call = {
        "id": f"call-{len(messages)}",
        "type": "function",
        "function": {"name": tools[0]["function"]["name"], "arguments": json.dumps({"key": key})},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=calls_the_tool)) as server:
        yield server


def evaluate(stub: StubServer, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_TRACKING": "0"}
    return subprocess.run(
        [VFOPS, "eval", "v1_broken_tool", "-m", "stub-model", "-b", stub.base_url, "-n", "3",
         "-r", "2", "-o", str(tmp_path / "out"), *extra],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_run_whose_tool_calls_all_fail_says_so(stub: StubServer, tmp_path: Path) -> None:
    done = evaluate(stub, tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout  # not asked to fail on it
    (warning,) = [line for line in done.stdout.splitlines() if line.startswith("warning:")]
    assert "6 of 6 tool calls failed" in warning and "401 Unauthorized" in warning, warning
    (results,) = (tmp_path / "out").rglob("results.jsonl")
    for line in results.read_bytes().splitlines():
        row = orjson.loads(line)
        assert row["reward"] == 0.0
        assert row["metrics"]["tool_calls"] == row["metrics"]["tool_errors"] == 1.0
        assert "401 Unauthorized" in row["info"]["first_tool_error"]
    (metadata,) = (tmp_path / "out").rglob("metadata.json")
    summary = orjson.loads(metadata.read_bytes())["summary"]
    assert (summary["tool_calls"], summary["tool_errors"]) == (6, 6)


def test_max_tool_error_rate_fails_the_run(stub: StubServer, tmp_path: Path) -> None:
    done = evaluate(stub, tmp_path, "--max-tool-error-rate", "0.5")
    assert done.returncode == 3, done.stderr + done.stdout
    assert "tool" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_unreachable_tool_server_is_named_as_the_cause(stub: StubServer, tmp_path: Path) -> None:
    """A toolset pointed at a server that is not there (v1_lookup's ``tools.url`` on a
    closed port): each rollout's error names the connection failure, never the task
    group that wrapped it."""
    import socket

    with socket.socket() as closed:  # a port nobody listens on once it is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {**os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_TRACKING": "0"}
    args = json.dumps({"task": {"tools": {"url": f"http://127.0.0.1:{port}/mcp"}}})
    done = subprocess.run(
        [VFOPS, "eval", "v1_lookup", "-m", "stub-model", "-b", stub.base_url, "-n", "2",
         "-r", "1", "-o", str(tmp_path / "out"), "-a", args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr + done.stdout  # every rollout errored
    (results,) = (tmp_path / "out").rglob("results.jsonl")
    for line in results.read_bytes().splitlines():
        message = orjson.loads(line)["error"]["message"]
        assert "TaskGroup" not in message and "Connect" in message, message
