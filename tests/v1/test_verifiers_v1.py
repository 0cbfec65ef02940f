"""Tasksets written for verifiers 0.4 (``verifiers.v1``) under vfops, against verifiers'
own ``vf-eval`` on the same scripted endpoint, over real HTTP: the conformance suite.

Run in .venv-v1 (``make test-v1``; CI: .ci/run): verifiers 0.4 cannot share a venv with
the 0.3 of the suite's venv. The tasksets (tests/verifiers_v1_envs, vfops's own, each
with the shape of a kind of upstream taskset): ``v1_arith`` (tool-less: a stop hook, a
zero-weight reward, a metric), ``v1_scripted_user`` (a user replaying turns),
``v1_lookup`` (an MCP toolset per rollout), ``v1_notes`` (one MCP server shared by the
taskset, each rollout's state reached over the interception's ``/state`` route),
``v1_guarded`` (a response stop and interceptors, one asking a referee model),
``v1_judged`` (verifiers' reference judge given in ``-a``), ``v1_twice`` (one role run
twice per episode, ``finalize`` comparing the attempts), ``v1_endless`` (an infinite
taskset run with ``-n``, a scripted user), ``v1_duel`` (two agents, zero-sum rewards set
in ``run()``), ``v1_picture`` (a user that sends PNG images) and ``v1_verified`` (a
reward that runs a uv script in the rollout's runtime, as upstream's ``gsm8k``). The
endpoint's replies are a pure function of the request (tests/v1/scripted_endpoint.py).

Per task, both evals must give the same multiset of episodes, each the multiset of its
traces' (reward, verifiers' per-function scores and metrics, verifiers' stop condition,
turns, agent); vfops's own metrics (tool calls...) are not verifiers' and are left out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.v1.scripted_endpoint import reply
from vfops.testing import StubConfig, StubServer

VENV_BIN = Path(sys.executable).parent
VFOPS = str(VENV_BIN / "vfops")
VF_EVAL = str(VENV_BIN / "vf-eval")

Trace = tuple[float | None, tuple[tuple[str, float], ...], str, int, str]
"""One trace: reward, per-function scores and metrics, stop condition, turns, agent."""
ONE_SEAT = "agent"
"""The agent name verifiers gives the one seat of a single-agent Env; vfops records a
rollout that is its episode's only trace with agent "" (an Env of its own may still
record its one seat's name)."""
Episodes = dict[int, list[tuple[Trace, ...]]]
"""Per task (its idx): its episodes, each the sorted tuple of its traces, sorted."""


@dataclass(frozen=True)
class Case:
    taskset: str
    n: int
    rewards: frozenset[float]
    """The distinct rewards the scripted endpoint earns on the first n tasks (right and
    wrong answers both)."""
    stops: frozenset[str]
    r: int = 1
    roles: tuple[str, ...] = ("agent",)
    """The Env's agent roles (each run in verifiers' tool-less ``null`` harness locally)."""
    traces_per_episode: int = 1


CASES = [
    Case("v1_arith", 6, frozenset({0.0, 1.0}), frozenset({"agent_completed"})),
    Case("v1_scripted_user", 4, frozenset({0.0, 1 / 3, 2 / 3, 1.0}), frozenset({"user_closed"})),
    Case("v1_lookup", 3, frozenset({0.0, 1.0}), frozenset({"agent_completed"})),
    # two rollouts of each task at once, on the one shared notebook server
    Case("v1_notes", 3, frozenset({0.0, 1.0}), frozenset({"agent_completed"}), r=2),
    Case("v1_guarded", 6, frozenset({0.0, 1.0}), frozenset({"agent_completed", "halted"})),
    Case("v1_judged", 4, frozenset({0.0, 1.0}), frozenset({"agent_completed"})),
    Case(
        "v1_twice", 3, frozenset({0.0, 1.0, 1.5}), frozenset({"agent_completed"}),
        roles=("writer",), traces_per_episode=2,
    ),
    Case("v1_endless", 4, frozenset({1 / 3, 1.0}), frozenset({"user_closed"})),
    Case(
        "v1_duel", 4, frozenset({-2.0, -1.0, 1.0, 2.0}), frozenset({"user_closed"}),
        roles=("opener", "responder"), traces_per_episode=2,
    ),
    Case("v1_picture", 4, frozenset({0.0, 1.0}), frozenset({"user_closed"})),
    # the reward a uv script in the rollout's runtime (vfops: from a warm interpreter)
    Case("v1_verified", 8, frozenset({0.0, 1.0}), frozenset({"agent_completed"}), r=2),
]  # fmt: skip


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


def endpoint(stub: StubServer) -> dict[str, str]:
    """A judge's endpoint: the stub (verifiers' default is a hosted model)."""
    return {"base_url": stub.base_url, "api_key_var": "STUB_KEY", "model": "stub-model"}


def taskset_arguments(taskset: str, stub: StubServer) -> dict[str, Any]:
    """What vfops gets in ``-a`` (vf-eval the same, as ``--env.taskset.*`` flags)."""
    if taskset == "v1_guarded":
        return {"task": {"referee": endpoint(stub)}}
    if taskset == "v1_judged":
        return {"task": {"judges": [{"id": "reference", **endpoint(stub)}]}}
    return {}


def vf_eval_flags(arguments: dict[str, Any], prefix: str = "--env.taskset") -> list[str]:
    """``arguments`` as vf-eval's dotted flags (a list value as JSON)."""
    flags = []
    for key, value in arguments.items():
        flag = f"{prefix}.{key.replace('_', '-')}"
        if isinstance(value, dict):
            flags += vf_eval_flags(value, flag)
        else:
            flags += [flag, json.dumps(value) if isinstance(value, list) else str(value)]
    return flags


def run_vfops(case: Case, stub: StubServer, env: dict[str, str], cwd: Path) -> tuple[str, Path]:
    """``vfops eval`` of the case: its run id and results.jsonl."""
    done = vfops(
        ["eval", case.taskset, "-m", "stub-model", "-b", stub.base_url, "-n", str(case.n),
         "-r", str(case.r), "-o", str(cwd / "out"), "--no-tracking",
         "-a", json.dumps(taskset_arguments(case.taskset, stub))],
        env, cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    run_id = re.search(r"run: (\w+)", done.stdout)
    assert run_id is not None, done.stdout
    (results,) = (cwd / "out").rglob("results.jsonl")
    return run_id.group(1), results


def vfops_episodes(results: Path, names: set[str]) -> Episodes:
    """vfops's rows grouped into episodes: a row with an ``episode`` is one of its
    episode's traces (``rollout_index`` = episode * 1000 + its position); a row without
    is its episode's only trace."""
    grouped: dict[tuple[int, object], list[Trace]] = defaultdict(list)
    for line in results.read_bytes().splitlines():
        row = orjson.loads(line)
        episode = row["episode"]
        if episode is None:
            assert row["agent"] == "", row["agent"]
            key: object = ("only", row["rollout_index"])
        else:
            assert row["agent"], row
            assert row["rollout_index"] // 1000 == episode, row["rollout_index"]
            key = episode
        scores = tuple(sorted((k, v) for k, v in row["metrics"].items() if k in names))
        agent = row["agent"] or ONE_SEAT
        trace = (row["reward"], scores, row["info"]["stop_condition"], row["turns"], agent)
        grouped[(row["example_id"], key)].append(trace)
    return per_task(grouped)


def run_vf_eval(case: Case, stub: StubServer, env: dict[str, str], cwd: Path) -> list[Any]:
    """verifiers' own eval, in-process runner, each role in its tool-less ``null`` harness
    on the subprocess runtime (what vfops's in-process harness stands in for): the
    episodes of its traces.jsonl."""
    roles = [
        flag
        for role in case.roles
        for flag in (f"--env.{role}.harness.id", "null", f"--env.{role}.runtime.type", "subprocess")
    ]
    done = subprocess.run(
        [VF_EVAL, case.taskset, "-m", "stub-model", "--client.base-url", stub.base_url,
         "--client.api-key-var", "STUB_KEY", *roles, "--env.interception.type", "server",
         "--no-push", "--no-rich", "-n", str(case.n), "-r", str(case.r), "-o", str(cwd / "vf"),
         *vf_eval_flags(taskset_arguments(case.taskset, stub))],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (traces,) = (cwd / "vf").rglob("traces.jsonl")
    episodes = [orjson.loads(line) for line in traces.read_bytes().splitlines()]
    for episode in episodes:
        assert episode["ok"], episode["errors"]
        assert all(trace["ok"] for trace in episode["traces"]), episode
    return episodes


def verifiers_names(episodes: list[Any]) -> set[str]:
    """The reward and metric names verifiers recorded in a run."""
    return {
        name
        for episode in episodes
        for trace in episode["traces"]
        for name in (*trace["rewards"], *trace["metrics"])
    }


def vf_eval_episodes(episodes: list[Any]) -> Episodes:
    grouped: dict[tuple[int, int], list[Trace]] = {}
    for number, episode in enumerate(episodes):
        for trace in episode["traces"]:
            rewards = {k: v for k, v in trace["rewards"].items() if v is not None}
            scores = {k: v["score"] for k, v in rewards.items()} | trace["metrics"]
            outcome = (
                sum(v["score"] * v["weight"] for v in rewards.values()),
                tuple(sorted(scores.items())),
                trace["stop_condition"],
                sum(1 for node in trace["nodes"] if node.get("sampled")),
                trace["agent"]["name"],
            )
            idx = trace["task"]["data"]["idx"]
            grouped.setdefault((idx, number), []).append(outcome)
    return per_task(grouped)


def per_task(grouped: dict[tuple[int, Any], list[Trace]]) -> Episodes:
    """Episodes keyed by (task idx, episode) as each task's sorted episodes (multisets)."""
    found: dict[int, list[tuple[Trace, ...]]] = defaultdict(list)
    for (idx, _), traces in grouped.items():
        found[idx].append(tuple(sorted(traces, key=repr)))
    return {idx: sorted(episodes, key=repr) for idx, episodes in found.items()}


@pytest.mark.parametrize("case", CASES, ids=[case.taskset for case in CASES])
def test_each_task_scores_as_vf_eval_scores_it(
    case: Case, stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    recorded = run_vf_eval(case, stub, home, tmp_path)
    theirs = vf_eval_episodes(recorded)
    # the taskset and the script are what they say: the first n tasks, r episodes of
    # each, right and wrong answers, the stops they are written to reach
    assert sorted(theirs) == list(range(case.n))
    shapes = {len(episode) for episodes in theirs.values() for episode in episodes}
    assert {len(episodes) for episodes in theirs.values()} == {case.r}
    assert shapes == {case.traces_per_episode}
    traces = [trace for episodes in theirs.values() for e in episodes for trace in e]
    assert {reward for reward, *_ in traces} == case.rewards
    assert {stop for _, _, stop, _, _ in traces} == case.stops

    run_id, results = run_vfops(case, stub, home, tmp_path)
    assert vfops_episodes(results, verifiers_names(recorded)) == theirs
    rows = [orjson.loads(line) for line in results.read_bytes().splitlines()]
    check_rows(case, rows)
    shown = vfops(["runs", "show", run_id, "--rollout", "0"], home, tmp_path)
    assert shown.returncode == 0, shown.stderr
    if case.traces_per_episode > 1:  # the episode's traces shown together, each named
        assert all(f"agent {role}" in shown.stdout for role in case.roles), shown.stdout
    if case.taskset == "v1_picture":
        assert "image/png" in shown.stdout, shown.stdout


def check_rows(case: Case, rows: list[dict[str, Any]]) -> None:
    """What a row records beyond the scores, by taskset."""
    if case.traces_per_episode > 1:  # the positions of an episode's traces
        episodes: dict[tuple[int, int], list[int]] = defaultdict(list)
        for row in rows:
            assert row["episode"] is not None, row
            episodes[(row["example_id"], row["episode"])].append(row["rollout_index"] % 1000)
        assert all(sorted(p) == [0, 1] for p in episodes.values()), episodes
        agents = {row["agent"] for row in rows}
        assert agents == set(case.roles), agents
    if case.taskset == "v1_duel":  # zero-sum within each hand
        chips: dict[tuple[int, int], float] = defaultdict(float)
        for row in rows:
            chips[(row["example_id"], row["episode"])] += row["metrics"]["chips"]
        assert set(chips.values()) == {0.0}, chips
    if case.taskset == "v1_scripted_user":  # one conversation: every turn answered in it
        for row in rows:
            assert [m["role"] for m in row["prompt"]] == ["user"]
            roles = [m["role"] for m in row["completion"]]
            assert roles == ["assistant", "user", "assistant", "user", "assistant"], roles
            asked = [
                m["content"] for m in [*row["prompt"], *row["completion"]] if m["role"] == "user"
            ]
            assert [t.split(":")[0] for t in asked] == ["Turn 1", "Turn 2", "Turn 3"]
    if case.taskset == "v1_picture":  # every square sent is recorded, as sent
        for row in rows:
            urls = [
                part["image_url"]["url"]
                for m in [*row["prompt"], *row["completion"]]
                if m["role"] == "user" and isinstance(m["content"], list)
                for part in m["content"]
                if part.get("type") == "image_url"
            ]
            assert len(urls) == len(row["answer"]), row
            assert all(u.startswith("data:image/png;base64,iVBORw0KGgo") for u in urls), urls


def test_listed_by_library_and_arguments_checked(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    listed = vfops(["env", "list"], home, tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[1]: line for line in listed.stdout.splitlines() if "│" in line}
    for case in CASES:
        assert "verifiers-v1" in rows[case.taskset], case.taskset
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


def test_a_container_task_whose_image_is_not_here_is_refused_before_any_request(
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
    # it needs a container of the runtime's default image, which this host does not have
    assert "task 0" in line and "needs image 'docker.io/library/python:3.11-slim'" in line
    assert "--image-map docker.io/library/python:3.11-slim=LOCAL" in line, line
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
    assert "'own_harness' ships its own harness" in line, line
    assert stub.stats["requests"] == before
