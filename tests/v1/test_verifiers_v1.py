"""Tasksets written for verifiers 0.4 (``verifiers.v1``) under vfops, against verifiers'
own ``vf-eval`` on the same stub endpoint, over real HTTP.

Run in .venv-v1 (``make test-v1``; CI: .ci/run): verifiers 0.4 cannot share a venv with
the 0.3 of the suite's venv. The tasksets: ``v1_arith`` (synthetic, tool-less, a stop
hook, a zero-weight reward and a metric) and two copied unchanged from verifiers'
``environments/``: ``glossary`` (an MCP toolset launched per rollout as a local
subprocess) and ``interception`` (response stops and interceptors).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from vfops.testing import StubConfig, StubServer
from vfops.testing._stub_server import echo_answer_reply

VENV_BIN = Path(sys.executable).parent
VFOPS = str(VENV_BIN / "vfops")
VF_EVAL = str(VENV_BIN / "vf-eval")


Outcome = tuple[float | None, dict[str, float], str]
"""A rollout's reward, its per-function scores and metrics, and verifiers' stop condition."""

EXPECTED_STOPS = {
    "v1_arith": {"agent_completed"},
    "glossary": {"agent_completed"},
    # the response stop ends one rollout; the interceptors rewrite the others
    "interception": {"agent_completed", "stop_guard"},
    "v1_scripted_user": {"user_closed"},  # the scripted user ends each exchange
}


def reply(request: dict[str, Any]) -> dict[str, Any]:
    """The stub's answers: a tool call when tools are offered and no result came back
    yet (glossary), the tool's result in tags after one; else the arith hint echoed."""
    messages = request["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return {"role": "assistant", "content": f"<answer>{last['content']}</answer>"}
    text = str(last.get("content") or "")
    tools = request.get("tools") or []
    wanted = re.search(r'look up "([^"]+)"', text)
    if tools and wanted:
        call = {
            "id": f"call-{len(messages)}",
            "type": "function",
            "function": {
                "name": tools[0]["function"]["name"],
                "arguments": json.dumps({"name": wanted.group(1)}),
            },
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if "Reply BLOCK if" in text:  # interception's judge
        return {
            "role": "assistant",
            "content": "BLOCK" if "JUDGE_BLOCK" in text.split("Candidate:")[-1] else "ALLOW",
        }
    marker = re.search(r"Reply with exactly (\w+)", text)
    if marker:
        return {"role": "assistant", "content": marker.group(1)}
    return {"role": "assistant", "content": echo_answer_reply(text)}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["VFOPS_HOME"] = str(tmp_path / "home")
    env["STUB_KEY"] = "stub"
    return env


def vfops(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VFOPS, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def judge(stub: StubServer) -> dict[str, str]:
    """interception's judge, on the stub (its default is a hosted model)."""
    return {"base_url": stub.base_url, "api_key_var": "STUB_KEY", "model": "stub-model"}


def vfops_rewards(
    taskset: str, stub: StubServer, n: int, env: dict[str, str], cwd: Path
) -> dict[int, Outcome]:
    args = {"task": {"judge": judge(stub)}} if taskset == "interception" else {}
    done = vfops(
        ["eval", taskset, "-m", "stub-model", "-b", stub.base_url, "-n", str(n), "-r", "1",
         "-o", str(cwd / "out"), "--no-tracking", "-a", json.dumps(args)],
        env, cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    (results,) = (cwd / "out").rglob("results.jsonl")
    found = {}
    for line in results.read_bytes().splitlines():
        row = orjson.loads(line)
        found[row["example_id"]] = (row["reward"], row["metrics"], row["info"]["stop_condition"])
    return found


def vf_eval_rewards(
    taskset: str, stub: StubServer, n: int, env: dict[str, str], cwd: Path
) -> dict[int, Outcome]:
    """verifiers' own eval, in-process runner, its tool-less ``null`` harness on the
    subprocess runtime (what vfops's in-process harness stands in for)."""
    done = subprocess.run(
        [VF_EVAL, taskset, "-m", "stub-model", "--client.base-url", stub.base_url,
         "--client.api-key-var", "STUB_KEY", "--env.agent.harness.id", "null",
         "--env.agent.runtime.type", "subprocess", "--env.interception.type", "server",
         "--no-push", "--no-rich", "-n", str(n), "-o", str(cwd / "vf"),
         *(arg for key, value in judge(stub).items() if taskset == "interception"
           for arg in (f"--env.taskset.task.judge.{key.replace('_', '-')}", value))],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (traces,) = (cwd / "vf").rglob("traces.jsonl")
    found = {}
    for line in traces.read_bytes().splitlines():
        (trace,) = orjson.loads(line)["traces"]
        assert trace["ok"], trace["errors"]
        scores = {k: v["score"] for k, v in trace["rewards"].items() if v is not None}
        reward = sum(v["score"] * v["weight"] for v in trace["rewards"].values() if v)
        outcome = (reward, {**scores, **trace["metrics"]}, trace["stop_condition"])
        found[trace["task"]["data"]["idx"]] = outcome
    return found


@pytest.mark.parametrize(
    ("taskset", "n"),
    [("v1_arith", 20), ("glossary", 5), ("interception", 4), ("v1_scripted_user", 6)],
)
def test_per_rollout_rewards_equal_vf_eval(
    taskset: str, n: int, stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    ours = vfops_rewards(taskset, stub, n, home, tmp_path)
    theirs = vf_eval_rewards(taskset, stub, n, home, tmp_path)
    assert sorted(ours) == sorted(theirs) == list(range(n))
    assert ours == theirs
    assert {stop for _, _, stop in ours.values()} == EXPECTED_STOPS[taskset]
    if taskset == "v1_arith":  # right and wrong answers, each scored as such
        assert {reward for reward, _, _ in ours.values()} == {0.0, 1.0}
    if taskset == "v1_scripted_user":  # one conversation: every turn answered in it
        (results,) = (tmp_path / "out").rglob("results.jsonl")
        for line in results.read_bytes().splitlines():
            row = orjson.loads(line)
            assert [m["role"] for m in row["prompt"]] == ["user"]
            roles = [m["role"] for m in row["completion"]]
            assert roles == ["assistant", "user", "assistant", "user", "assistant"], roles
            asked = [
                m["content"] for m in [*row["prompt"], *row["completion"]] if m["role"] == "user"
            ]
            assert [t.split(":")[0] for t in asked] == ["Turn 1", "Turn 2", "Turn 3"]


def test_listed_by_library_and_arguments_checked(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    listed = vfops(["env", "list"], home, tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if "│" in line}
    assert "verifiers-v1" in rows["v1_arith"] and "verifiers-v1" in rows["glossary"]
    assert "vfops" in rows["arithmetic"].split("│")[2]

    wrong = vfops(
        ["eval", "v1_arith", "-m", "stub-model", "-b", stub.base_url, "-n", "2",
         "-a", '{"task": {"rewards": {"formatted": {"weight": "heavy"}}}}'],
        home, tmp_path,
    )  # fmt: skip
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    (line,) = wrong.stderr.strip().splitlines()
    assert "task.rewards.formatted.weight" in line and "-a" in line
    unknown = vfops(
        ["eval", "v1_arith", "-m", "stub-model", "-b", stub.base_url, "-a", '{"sizes": 3}'],
        home, tmp_path,
    )  # fmt: skip
    assert unknown.returncode == 2 and "'sizes'" in unknown.stderr, unknown.stderr


def test_a_container_task_is_refused_before_any_request(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    package = tmp_path / "site" / "boxed_task"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            import verifiers.v1 as vf

            class BoxedTask(vf.Task):
                NEEDS_CONTAINER = True

            class BoxedTaskset(vf.Taskset[BoxedTask, vf.TasksetConfig]):
                def load(self):
                    return [BoxedTask(vf.TaskData(prompt="ls /"))]

            __all__ = ["BoxedTaskset"]
            """
        )
    )
    env = {**home, "PYTHONPATH": str(tmp_path / "site")}
    before = stub.stats["requests"]
    done = vfops(["eval", "boxed_task", "-m", "stub-model", "-b", stub.base_url], env, tmp_path)
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert "needs a container runtime" in line and "task 0" in line, line
    assert stub.stats["requests"] == before


def test_a_run_is_recorded_shown_and_published(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    done = vfops(
        ["eval", "v1_arith", "-m", "stub-model", "-b", stub.base_url, "-n", "6", "-r", "2"],
        home, tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    run_id = re.search(r"run: (\w+)", done.stdout).group(1)  # type: ignore[union-attr]
    shown = vfops(["runs", "show", run_id, "--rollout", "0"], home, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "ANSWER_HINT" in shown.stdout and "<answer>" in shown.stdout
    assert "verifiers-v1==0.4" in vfops(["runs", "show", run_id], home, tmp_path).stdout

    source = Path(__file__).parents[1] / "verifiers_v1_envs" / "v1_arith"
    published = vfops(["env", "publish", str(source)], home, tmp_path)
    assert published.returncode == 0, published.stderr + published.stdout
    assert "v1_arith" in published.stdout or "v1-arith" in published.stdout


def test_a_taskset_with_its_own_harness_is_refused_before_any_request(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    """A taskset that ships a harness (a program it runs in) is refused: vfops runs the
    tool-less chat loop only."""
    package = tmp_path / "site" / "own_harness"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            import verifiers.v1 as vf
            from verifiers.v1.harnesses.null import NullHarness

            class ProgramHarness(NullHarness):
                pass

            class PlainTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
                def load(self):
                    return [vf.Task(vf.TaskData(prompt="hi"))]

            __all__ = ["PlainTaskset", "ProgramHarness"]
            """
        )
    )
    env = {**home, "PYTHONPATH": str(tmp_path / "site")}
    before = stub.stats["requests"]
    done = vfops(["eval", "own_harness", "-m", "stub-model", "-b", stub.base_url], env, tmp_path)
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert "runs in the 'own_harness' harness" in line, line
    assert stub.stats["requests"] == before
