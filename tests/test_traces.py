"""Eval rollouts as MLflow traces: one per rollout, linked to the run, a span per model
turn and tool call, each reward function's score as feedback; seen through MLflow's API
and through its UI in a real browser."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.browser import render, visible_text
from tests.mlflow_fixtures import Backend, MlflowServer, fake_aws_env
from tests.registry_fixtures import make_error_record, make_record, store_rollouts, stored_rollouts
from vfops.registry import (
    NewRun,
    create_run,
    dispose_engines,
    finish_run,
    get_engine,
    get_run,
    session_scope,
)
from vfops.testing import StubConfig, StubServer
from vfops.tracking import log_eval_run, mlflow_client

pytestmark = pytest.mark.tracking  # what these tests check is in MLflow (tests/conftest.py)

VFOPS = str(Path(sys.executable).parent / "vfops")


@pytest.fixture(autouse=True)
def _traces_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default share of traces (the suite turns them off), a registry per test."""
    monkeypatch.delenv("VFOPS_TRACE_ROLLOUTS", raising=False)
    monkeypatch.setenv("VFOPS_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")


def _traces(mlflow_run_id: str) -> list[Any]:
    """The traces of an MLflow run (all in by the time the evaluation returned)."""
    client = mlflow_client()
    experiment_id = client.get_run(mlflow_run_id).info.experiment_id
    return list(
        client.search_traces(locations=[experiment_id], run_id=mlflow_run_id, max_results=500)
    )


def _feedback(trace: Any) -> dict[str, Any]:
    """Feedback name -> value (or its error code) of a trace."""
    from mlflow.entities import Feedback

    found: dict[str, Any] = {}
    for assessment in trace.info.assessments:
        if isinstance(assessment, Feedback):
            error = assessment.error
            found[assessment.name] = error.error_code if error is not None else assessment.value
    return found


def _calculator_reply(payload: dict[str, Any]) -> dict[str, Any]:
    """Turn 1: one tool call; turn 2: the tool's result as the answer (right or wrong)."""
    messages = payload["messages"]
    if messages[-1]["role"] != "tool":
        arguments = '{"expression": "6 * 7"}'
        call = {"id": "call_1", "type": "function",
                "function": {"name": "calculate", "arguments": arguments}}  # fmt: skip
        return {"content": None, "tool_calls": [call]}
    return {"content": f"<answer>{messages[-1]['content']}</answer>"}


def test_an_evaluation_logs_each_rollout_as_a_trace_of_its_run(
    backend: Backend, tmp_path: Path
) -> None:
    """The sweep/nightly path (evaluate, tracker waited for): N x R traces on the run, each
    with the prompt as request, a span per turn and per tool call, and every score."""
    from vfops.evaluation import EvalRequest, ModelOptions, RunOptions, evaluate

    with StubServer(StubConfig(reply_mode=_calculator_reply)) as stub:
        result = evaluate(
            EvalRequest(
                env_name="calculator", model="stub-model", num_examples=3, rollouts_per_example=2
            ),
            RunOptions(output_root=tmp_path / "out"),
            model_options=ModelOptions(base_url=stub.base_url),
        )
    assert result.status == "completed", result.error
    assert result.mlflow_run_id is not None and result.run_id is not None
    records = {r.trace_id: r for r in stored_rollouts(get_engine(), result.run_id)}
    assert len(records) == 6

    traces = _traces(result.mlflow_run_id)
    assert len(traces) == 6
    assert {t.info.tags["vfops.trace_id"] for t in traces} == set(records)
    for trace in traces:
        record = records[trace.info.tags["vfops.trace_id"]]
        assert trace.info.tags["vfops.run_id"] == result.run_id
        assert trace.info.trace_metadata["mlflow.sourceRun"] == result.mlflow_run_id
        spans = [(s.name, s.span_type) for s in trace.data.spans]
        assert spans[0][1] == "AGENT"
        assert spans[1:] == [
            ("turn 1", "CHAT_MODEL"), ("calculate", "TOOL"), ("turn 2", "CHAT_MODEL"),
            ("score", "EVALUATOR"),
        ]  # fmt: skip
        tool = trace.data.spans[2]
        assert tool.inputs == {"expression": "6 * 7"} and tool.outputs == "42"
        user_text = record.prompt[-1]["content"]
        assert user_text[:40] in (trace.info.request_preview or "")
        assert "<answer>42</answer>" in (trace.info.response_preview or "")
        feedback = _feedback(trace)
        assert set(record.metrics) <= set(feedback)
        assert feedback["reward"] == pytest.approx(record.reward)
        for name, score in record.metrics.items():
            assert feedback[name] == pytest.approx(score), name
        expectations = [a for a in trace.info.assessments if a.name == "expected_answer"]
        assert [e.value for e in expectations] == [record.answer]


def _registry_run(engine: Any, *, examples: int, rollouts: int) -> str:
    """A completed run: rewards 1.0 (even rollout index) and 0.25, and one error."""
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name="arithmetic",
                environment_version="1.2.0",
                environment_content_hash="ab" * 32,
                model="test-model",
                base_url="http://127.0.0.1:9/v1",
                sampling_args={},
                env_args={},
                num_examples=examples,
                rollouts_per_example=rollouts,
                config_fingerprint="e" * 64,
            ),
        )
        run_id = run.id
    records = [make_record(e, r) for e in range(examples) for r in range(rollouts)]
    records.append(make_error_record(examples, 0))
    store_rollouts(engine, run_id, records)
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", {"pass_threshold": 1.0})
    return run_id


def test_a_large_run_logs_a_share_of_its_passing_and_of_its_failed_rollouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("VFOPS_TRACE_ROLLOUTS", "2")
    engine = get_engine(f"sqlite:///{tmp_path / 'registry.db'}")
    run_id = _registry_run(engine, examples=4, rollouts=2)  # 4 pass, 4 fail, 1 error

    mlflow_id = log_eval_run(engine, run_id)

    traces = _traces(mlflow_id)
    by_key = {(int(t.info.tags["vfops.example_id"]), int(t.info.tags["vfops.rollout_index"])): t
              for t in traces}  # fmt: skip
    failed = {(e, 1) for e in range(4)} | {(4, 0)}
    # two failures (the errored one first) and the first examples' passing ones
    assert set(by_key) == {(4, 0), (0, 1)} | {(0, 0), (1, 0)}
    assert _feedback(by_key[(4, 0)])["reward"] == "TimeoutError"
    assert by_key[(4, 0)].info.state == "ERROR"
    assert _feedback(by_key[(0, 1)]) == {"reward": 0.25, "correct": 1.0, "format": 0.5}
    assert all(t.info.tags["vfops.failed"] == str(k in failed).lower() for k, t in by_key.items())

    # logging the run again adds no trace twice; "all" adds the passing ones left out
    monkeypatch.setenv("VFOPS_TRACE_ROLLOUTS", "all")
    assert log_eval_run(engine, run_id) == mlflow_id
    assert len(_traces(mlflow_id)) == 9

    monkeypatch.setenv("VFOPS_TRACE_ROLLOUTS", "off")
    other = _registry_run(engine, examples=1, rollouts=1)
    assert _traces(log_eval_run(engine, other)) == []


def test_the_mlflow_ui_lists_the_rollouts_of_an_eval_with_their_rewards(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    """``vfops eval`` as a user runs it, then MLflow's Traces page in headless Chromium."""
    env = {
        **os.environ,
        **fake_aws_env(mlflow_server.s3_endpoint),
        "MLFLOW_TRACKING_URI": mlflow_server.url,
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_DATABASE_URL": f"sqlite:///{tmp_path / 'registry.db'}",
    }
    env.pop("VFOPS_TRACE_ROLLOUTS", None)
    with StubServer(StubConfig(reply_mode="arithmetic")) as stub:
        done = subprocess.run(
            [VFOPS, "eval", "arithmetic", "-m", "stub-model", "-b", stub.base_url, "-n", "3",
             "-r", "2", "-q", "-o", str(tmp_path / "out")],
            capture_output=True, text=True, env=env, timeout=180, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = re.search(r"^run: (\w+)", done.stdout, re.M)
    assert run_id is not None, done.stdout
    os.environ["VFOPS_DATABASE_URL"] = env["VFOPS_DATABASE_URL"]
    try:  # linked by the time the command exits
        with session_scope(get_engine(), write=False) as session:
            row = get_run(session, run_id.group(1))
            assert row is not None and row.mlflow_run_id
            mlflow_id = str(row.mlflow_run_id)
    finally:
        os.environ.pop("VFOPS_DATABASE_URL")
        dispose_engines()
    # it ends by naming the registry run, the MLflow run (its address) and the output folder
    assert f"\nmlflow run: {mlflow_server.url}/#/runs/{mlflow_id}\n" in done.stdout
    assert f"\nresults: {tmp_path / 'out'}" in done.stdout, done.stdout
    os.environ["MLFLOW_TRACKING_URI"] = mlflow_server.url
    try:
        traces = _traces(mlflow_id)
        run = mlflow_client().get_run(mlflow_id)
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI")
    experiment_id = run.info.experiment_id
    assert run.info.status == "FINISHED" and run.data.metrics["rollouts"] == 6  # logged into it
    assert run.data.tags["vfops.run_id"] == run_id.group(1)
    assert len(traces) == 6
    # the stub answers every question right: correct_answer 1, format 1, reward 1.2
    first = traces[0]
    question = re.search(r"What is [^?]+\?", first.info.request_preview or "")
    assert question is not None, first.info.request_preview
    (expected,) = [a.value for a in first.info.assessments if a.name == "expected_answer"]

    dom = render(
        f"{mlflow_server.url}/#/experiments/{experiment_id}/traces",
        screenshot="mlflow-traces-of-an-eval-run.png",
        budget_ms=30_000,
        width=2560,  # every column, beside MLflow's assistant pane
    )
    text = visible_text(dom)
    # one row per rollout, one column per assessment: each reward function, the reward
    assert "correct_answer expected_answer format_reward reward" in text, text[:3000]
    chunks = re.split(r" \d+ (?:seconds?|minutes?) ago ", text.split(" To pick up ")[0])
    rows = [chunk for chunk in chunks if chunk.startswith("What is")]
    assert len(rows) == 6, chunks
    mine = [row for row in rows if row.startswith(question.group(0))]
    assert len(mine) == 2, rows  # the example's two rollouts, each with its scores
    assert all(row.endswith(f" 1 {expected} 1 1.20") for row in mine), mine


def test_links_are_addresses_with_a_tracking_server_and_ids_without() -> None:
    from vfops.tracking import mlflow_run_link, mlflow_run_url, prefect_run_tags

    server = "https://user:secret@mlflow.example:5000/"
    assert mlflow_run_url("abc", server) == "https://mlflow.example:5000/#/runs/abc"
    assert mlflow_run_link("abc", tracking_uri=server) == "https://mlflow.example:5000/#/runs/abc"
    assert mlflow_run_link("abc", markdown=True, tracking_uri="http://127.0.0.1:5000") == (
        "[abc](http://127.0.0.1:5000/#/runs/abc)"
    )
    embedded = "sqlite:////home/u/.vfops/mlflow/mlflow.db"
    assert mlflow_run_url("abc", embedded) is None
    assert mlflow_run_link("abc", tracking_uri=embedded) == "abc"
    assert mlflow_run_link("abc", markdown=True, tracking_uri=embedded) == "`abc`"
    assert prefect_run_tags() == {}  # not in a flow run
