"""A run whose tool calls fail never looks right: counted per rollout and per run, said in
one line, a failed run above ``--max-tool-error-rate`` (exit 3); and a run argument that
cannot be recorded is named as such, never as a database fault.

The CLI runs as a subprocess against a stub endpoint on loopback that calls the offered
tool once, then answers with what the tool said.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.registry_fixtures import DIALECTS, database_url, stored_rollouts
from tests.test_bad_input import vfops
from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord
from vfops.evaluation import (
    EvalRequest,
    EvalResult,
    EvalSummary,
    ModelOptions,
    RunOptions,
    evaluate_async,
    iter_records,
)
from vfops.testing import StubConfig, StubServer

UNAUTHORIZED = "Client error '401 Unauthorized' for url 'http://127.0.0.1:9/state'"

TOOL_ENVS = f'''
"""Tool environments: a tool server that refuses every call, one that answers."""

from __future__ import annotations

import vfops


def fetch_state(key: str) -> str:
    """Read a value from the rollout's state server.

    Args:
        key: The key to read.
    """
    raise RuntimeError("{UNAUTHORIZED}")


def lookup(key: str) -> str:
    """Read a value from the table.

    Args:
        key: The key to read.
    """
    return {{"alpha": "42"}}.get(key, "none")


def answered(completion, answer):
    return 1.0 if answer in (completion[-1].get("content") or "") else 0.0


def tool_env(tool, num_examples):
    rows = [{{"question": f"What is under alpha? ({{i}})", "answer": "42"}}
            for i in range(num_examples)]
    rubric = vfops.Rubric(funcs=[answered])
    return vfops.ToolEnv(eval_dataset=rows, tools=[tool], rubric=rubric, max_turns=3)


def load_failing(num_examples=3):
    return tool_env(fetch_state, num_examples)


def load_passing(num_examples=3):
    return tool_env(lookup, num_examples)


class JudgeConfig:
    """What verifiers makes of a judge entry given in -a: not JSON."""

    def __init__(self, **fields):
        self.fields = fields


def load_judged(task):
    # as verifiers does it: the entries replaced in place, inside what it was given
    task["judges"] = [JudgeConfig(**judge) for judge in task["judges"]]
    return tool_env(lookup, 1)
'''

ENTRY_POINTS = """[vfops.environments]
tool_failing = tool_error_envs:load_failing
tool_passing = tool_error_envs:load_passing
tool_judged = tool_error_envs:load_judged
"""


def reply(request: dict[str, Any]) -> dict[str, Any]:
    """One call of the first offered tool, then an answer quoting what it said."""
    results = [m for m in request["messages"] if m["role"] == "tool"]
    tools = request.get("tools") or []
    if tools and not results:
        name = tools[0]["function"]["name"]
        call = {"id": "call_1", "type": "function",
                "function": {"name": name, "arguments": '{"key": "alpha"}'}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    said = results[-1]["content"] if results else "nothing"
    return {"role": "assistant", "content": f"The tool said: {said}"}


@pytest.fixture(scope="module")
def tool_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tool environments, "installed" into a folder for PYTHONPATH."""
    site = tmp_path_factory.mktemp("tool-site")
    (site / "tool_error_envs.py").write_text(TOOL_ENVS)
    dist_info = site / "vfops_tool_error_envs-0.0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vfops-tool-error-envs\nVersion: 0.0.1\nRequires-Dist: vfops\n"
    )
    (dist_info / "entry_points.txt").write_text(ENTRY_POINTS)
    (dist_info / "top_level.txt").write_text("tool_error_envs\n")
    return site


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def eval_args(env: str, stub: StubServer, tmp_path: Path, *flags: str) -> list[str]:
    return ["eval", env, "-m", "stub-model", "-b", stub.base_url, "-n", "3", "-r", "2",
            "-o", str(tmp_path / "out"), "-q", *flags]  # fmt: skip


def metadata_of(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    return orjson.loads(path.read_bytes())  # type: ignore[no-any-return]


def warnings_in(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("warning:")]


FIRST = f"fetch_state: RuntimeError: {UNAUTHORIZED}"


def test_failed_tool_calls_fail_the_run_above_max_tool_error_rate(
    tmp_path: Path, stub: StubServer, tool_site: Path, db_url: str
) -> None:
    """Every tool call refused (as a shared tool server without its key answers): the
    summary says so in one line naming the first error, --max-tool-error-rate 0.5 makes
    it exit 3, and the registry's summary and rollouts carry the counts."""
    extra = {"PYTHONPATH": str(tool_site), "VFOPS_DATABASE_URL": db_url}
    args = eval_args("tool_failing", stub, tmp_path, "--max-tool-error-rate", "0.5")
    proc = vfops(args, tmp_path, extra)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    said = f"error: completed with tool errors: 6 of 6 tool calls failed (first: {FIRST})"
    assert line.startswith(said)
    assert "--max-tool-error-rate" in line and "database" not in line
    assert warnings_in(proc.stdout) == [f"warning: 6 of 6 tool calls failed (first: {FIRST})"]

    metadata = metadata_of(tmp_path)
    assert metadata["status"] == "completed"  # a result, whose outcome failed the command
    from vfops.registry import dispose_engines, get_engine, get_run, session_scope

    engine = get_engine(db_url)
    with session_scope(engine, write=False) as session:
        run = get_run(session, metadata["run_id"])
        assert run is not None
        summary = dict(run.summary)
    records = stored_rollouts(engine, metadata["run_id"])
    dispose_engines()
    counts = {key: summary[key] for key in ("tool_calls", "tool_errors", "tool_error_rate")}
    assert counts == {"tool_calls": 6, "tool_errors": 6, "tool_error_rate": 1.0}
    assert summary["first_tool_error"] == FIRST
    assert len(records) == 6
    for record in records:
        assert (record.metrics["tool_calls"], record.metrics["tool_errors"]) == (1.0, 1.0)
        assert record.info["first_tool_error"] == FIRST
        assert record.reward == 0.0 and record.error is None  # scored: nothing raised


@pytest.mark.parametrize(
    ("env", "flags", "warned"),
    [
        ("tool_failing", [], True),  # warned, but a result: the flag was not given
        ("tool_passing", ["--max-tool-error-rate", "0"], False),
    ],
)
def test_the_summary_warns_only_when_tool_calls_failed(
    env: str, flags: list[str], warned: bool, tmp_path: Path, stub: StubServer, tool_site: Path
) -> None:
    proc = vfops(eval_args(env, stub, tmp_path, *flags), tmp_path, {"PYTHONPATH": str(tool_site)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    expected = [f"warning: 6 of 6 tool calls failed (first: {FIRST})"] if warned else []
    assert warnings_in(proc.stdout) == expected
    errors = 6 if warned else 0
    assert re.search(rf"^ +tool calls \(failed\) +6 \({errors}\)$", proc.stdout, re.M)
    summary = metadata_of(tmp_path)["summary"]
    assert (summary["tool_calls"], summary["tool_errors"]) == (6, errors)
    assert summary["first_tool_error"] == (FIRST if warned else None)
    assert summary["reward_mean"] == (0.0 if warned else 1.0)


@pytest.mark.parametrize("rate", ["-0.1", "1.5", "nan"])
def test_max_tool_error_rate_outside_0_to_1_is_refused_in_one_line(
    rate: str, tmp_path: Path, stub: StubServer, tool_site: Path
) -> None:
    args = eval_args("tool_failing", stub, tmp_path, "--max-tool-error-rate", rate)
    proc = vfops(args, tmp_path, {"PYTHONPATH": str(tool_site)})
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line == (
        f"error: --max-tool-error-rate must be between 0 and 1 (a share of tool calls), not "
        f"{float(rate)}"
    )
    assert not (tmp_path / "out").exists()


def test_a_loader_that_changes_its_arguments_leaves_what_is_recorded_as_given(
    tmp_path: Path, stub: StubServer, tool_site: Path
) -> None:
    """A judge given in -a, which the loader replaces by a config object in place (as
    verifiers does): the run is recorded with the arguments as given."""
    given = {"task": {"judges": [{"type": "reference", "weight": 1.0}]}}
    args = eval_args("tool_judged", stub, tmp_path, "-a", json.dumps(given))
    proc = vfops(args, tmp_path, {"PYTHONPATH": str(tool_site)})
    assert proc.returncode == 0, proc.stderr
    metadata = metadata_of(tmp_path)
    assert metadata["env_args"] == given and metadata["status"] == "completed"


class JudgeConfig:
    """A value no JSON holds (a pydantic model, a config class...)."""


FIX = "pass plain JSON (objects with string keys, arrays, strings, numbers, true/false/null) in "


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("env_args", {"task": {"judges": [{"type": "x"}, JudgeConfig()]}},
         f"env_args.task.judges[1] is a JudgeConfig, which a run cannot record; {FIX}"
         "env_args (-a/--env-args)"),
        ("sampling_args", {"extra_body": {"stop": {"a", "b"}}},
         f"sampling_args.extra_body.stop is a set, which a run cannot record; {FIX}"
         "sampling_args (-S/--sampling-args)"),
    ],
)  # fmt: skip
def test_arguments_that_are_not_json_are_refused_before_anything_starts(
    field: str, value: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    request = EvalRequest(env_name="tool_failing", model="stub-model", **{field: value})
    options = RunOptions(output_root=tmp_path / "out")
    with pytest.raises(VfopsError) as raised:
        asyncio.run(evaluate_async(request, options))
    assert str(raised.value) == expected
    assert not (tmp_path / "out").exists()


def test_a_value_changed_after_the_check_is_named_not_blamed_on_the_database(
    tmp_path: Path,
) -> None:
    """The registry's own path: a run whose arguments stopped being JSON after they were
    checked fails naming the value and the fix; the database is not mentioned."""
    from vfops.evaluation._open_run import open_in_background
    from vfops.evaluation._sinks import RegistrySink, SinkError
    from vfops.registry import RunStore, ThreadService, dispose_engines, get_engine

    request = EvalRequest(env_name="arithmetic", model="m", env_args={"task": {"judges": []}})
    request.validate()
    request.env_args["task"]["judges"].append(JudgeConfig())

    async def record() -> str:
        calls = RunStore(ThreadService(get_engine(f"sqlite:///{tmp_path / 'registry.db'}")))
        plan, opening = open_in_background(request, calls, tmp_path / "out")
        sink = RegistrySink(opening, plan.run_id or "", retry_s=0)
        sink.start()
        await asyncio.wait({opening})
        with pytest.raises(SinkError) as raised:
            await sink.write_group([])
        return str(raised.value)

    try:
        message = asyncio.run(record())
    finally:
        dispose_engines()
    assert message.startswith("registry: could not record run ")
    assert message.endswith(
        ": env_args.task.judges[0] is a JudgeConfig, which a run cannot record; "
        f"{FIX}env_args (-a/--env-args), then run the evaluation again"
    )
    assert "database" not in message


# --- the summary's own rules ----------------------------------------------------------


def tool_record(
    example_id: int, reward: float | None, calls: int, errors: int, first: str | None = None
) -> RolloutRecord:
    info = {} if first is None else {"first_tool_error": first}
    metrics = {"tool_calls": float(calls), "tool_errors": float(errors)}
    return RolloutRecord(example_id, 0, [], [], info=info, reward=reward, metrics=metrics)


@pytest.mark.parametrize(
    ("rollouts", "expected"),
    [
        # most tool calls failed: said, whatever the rewards
        ([(1.0, 2, 2, "a\nsecond line"), (1.0, 2, 1, "b")],
         "3 of 4 tool calls failed (first: a second line)"),
        # a few failed and nothing scored: said, as that
        ([(0.0, 4, 1, "timeout"), (0.0, 4, 0, None)],
         "every rollout scored 0 and 1 of 8 tool calls failed (first: timeout)"),
        ([(0.5, 4, 1, "timeout"), (0.0, 4, 0, None)], None),  # a few failed, one scored
        ([(0.0, 4, 0, None)], None),  # no tool call failed: a weak model
        ([(0.0, 0, 0, None)], None),  # no tool call at all
    ],
)  # fmt: skip
def test_the_warning_says_when_failed_tool_calls_explain_the_scores(
    rollouts: list[tuple[float, int, int, str | None]], expected: str | None
) -> None:
    summary = EvalSummary()
    for example_id, (reward, calls, errors, first) in enumerate(rollouts):
        summary.add(tool_record(example_id, reward, calls, errors, first))
    assert summary.tool_warning() == expected
    stored = summary.to_dict()
    calls = sum(r[1] for r in rollouts)
    failed = sum(r[2] for r in rollouts)
    assert (stored["tool_calls"], stored["tool_errors"]) == (calls, failed)
    assert stored["tool_error_rate"] == (failed / calls if calls else 0.0)


def test_a_rollout_that_counted_no_tool_calls_adds_nothing() -> None:
    summary = EvalSummary()
    # a rubric's own "tool_errors" metric, without the counts of vfops._tool_counts
    summary.add(RolloutRecord(0, 0, [], [], reward=0.0, metrics={"tool_errors": 3.0}))
    assert (summary.tool_calls, summary.tool_errors, summary.tool_warning()) == (0, 0, None)


@pytest.mark.parametrize(
    ("max_rate", "outcome"),
    [(1.0, "completed"), (0.25, "completed"), (0.2, "completed_with_errors")],
)
def test_the_outcome_follows_max_tool_error_rate(max_rate: float, outcome: str) -> None:
    summary = EvalSummary()
    summary.add(tool_record(0, 1.0, 4, 1, "x\ny"))
    summary.add(tool_record(1, 1.0, 4, 1))  # 2 of 8 failed: 0.25, not above 0.25
    result = EvalResult(None, summary, "completed", {})
    assert result.outcome(max_tool_error_rate=max_rate) == outcome
    problem = result.problem(max_tool_error_rate=max_rate)
    if outcome == "completed":
        assert problem is None
    else:
        assert problem is not None and problem.startswith(
            "completed with tool errors: 2 of 8 tool calls failed (first: x y), above "
            f"--max-tool-error-rate {max_rate:g};"
        )


def test_mlflow_metrics_carry_the_tool_counts() -> None:
    from vfops.tracking._eval_runs import _metrics_from_stored

    summary = EvalSummary()
    summary.add(tool_record(0, 0.0, 4, 3, "x"))
    metrics = _metrics_from_stored(summary.to_dict())
    assert {k: metrics[k] for k in ("tool_calls", "tool_errors", "tool_error_rate")} == {
        "tool_calls": 4.0,
        "tool_errors": 3.0,
        "tool_error_rate": 0.75,
    }
    # a summary stored before the counts existed logs none (not a made-up 0)
    assert "tool_calls" not in _metrics_from_stored({"rollouts": 1})


# --- verifiers' classic ToolEnv, through the adapter ------------------------------------


def vf_tool_env(fail: bool) -> Any:
    import verifiers as vf
    from datasets import Dataset

    def lookup(key: str) -> str:
        """Read a value from the table.

        Args:
            key: The key to read.
        """
        if fail:
            raise RuntimeError(UNAUTHORIZED)
        return {"alpha": "42"}.get(key, "none")

    async def answered(completion: Any, answer: str) -> float:
        last = completion[-1]
        content = last.get("content") if isinstance(last, dict) else last.content
        return 1.0 if answer in str(content or "") else 0.0

    rows = [{"question": f"What is under alpha? ({i})", "answer": "42"} for i in range(2)]
    return vf.ToolEnv(
        tools=[lookup], eval_dataset=Dataset.from_list(rows),
        rubric=vf.Rubric(funcs=[answered]), max_turns=3,
    )  # fmt: skip


@pytest.mark.parametrize("fail", [True, False])
def test_a_verifiers_tool_env_counts_its_failed_tool_calls(
    fail: bool, stub: StubServer, tmp_path: Path
) -> None:
    from vfops.adapters._verifiers import build_verifiers_environment

    env = build_verifiers_environment(lambda: vf_tool_env(fail), "vf_lookup")
    request = EvalRequest(env_name="vf_lookup", model="stub-model", num_examples=2)
    options = RunOptions(output_root=tmp_path, registry=False, tracking=False)
    result = asyncio.run(
        evaluate_async(
            request, options, environment=env, model_options=ModelOptions(base_url=stub.base_url)
        )
    )
    assert result.status == "completed" and result.run_dir is not None
    records = list(iter_records(result.run_dir))
    assert len(records) == 6
    for record in records:
        assert record.metrics["tool_calls"] == 1.0
        assert record.metrics["tool_errors"] == (1.0 if fail else 0.0)
        assert record.info.get("first_tool_error") == (
            f"RuntimeError: {UNAUTHORIZED}" if fail else None
        )
        assert record.reward == (0.0 if fail else 1.0)
    warning = result.summary.tool_warning()
    assert warning == (
        f"6 of 6 tool calls failed (first: RuntimeError: {UNAUTHORIZED})" if fail else None
    )
