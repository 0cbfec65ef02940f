"""The eval runner: streaming to disk, resume, interruption, summary statistics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from datasets import Dataset

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord, rollout_features
from vfops._types import Messages
from vfops.clients import ScriptedClient
from vfops.envs import SingleTurnEnv
from vfops.evaluation import (
    EvalRequest,
    EvalResult,
    EvalSummary,
    RunOptions,
    evaluate_async,
    iter_records,
    load_results,
    pass_at_k,
    read_metadata,
)
from vfops.evaluation._sinks import ArrowSink, RunFinish
from vfops.rubrics import Rubric


def correct(completion: Messages, answer: str) -> float:
    return 1.0 if completion[-1]["content"] == answer else 0.0


def make_env(n: int = 6) -> SingleTurnEnv:
    rows = [{"question": f"{i}", "answer": str(i)} for i in range(n)]
    return SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=Rubric(funcs=[correct]))


def echo_client(delay_s: float = 0.0) -> ScriptedClient:
    # Echoes the question: correct on every rollout.
    return ScriptedClient(lambda messages, tools: messages[-1]["content"], delay_s=delay_s)


def request(n: int = 6, r: int = 2, c: int = 4) -> EvalRequest:
    return EvalRequest(
        env_name="echo", model="scripted", num_examples=n, rollouts_per_example=r, max_concurrent=c
    )


def keys(run_dir: Path | None) -> list[tuple[int, int]]:
    assert run_dir is not None
    return sorted(r.key for r in iter_records(run_dir))


async def run(
    env: SingleTurnEnv,
    client: ScriptedClient,
    req: EvalRequest,
    root: Path,
    resume: Path | None = None,
) -> EvalResult:
    """The one entry point, on the run folder alone (no registry, no MLflow)."""
    return await evaluate_async(
        req,
        RunOptions(
            output_root=root, registry=False, resume=None if resume is None else str(resume)
        ),
        environment=env,
        client=client,
    )


async def test_run_streams_every_rollout_and_writes_a_dataset(tmp_path: Path) -> None:
    result = await run(make_env(), echo_client(), request(), tmp_path)
    run_dir = result.run_dir
    assert run_dir is not None and run_dir.is_relative_to(tmp_path / "evals" / "echo--scripted")
    assert keys(run_dir) == [(e, i) for e in range(6) for i in range(2)]
    assert result.summary.reward.mean == 1.0 and result.status == "completed"
    metadata = read_metadata(run_dir)
    assert metadata["status"] == "completed"
    assert metadata["summary"]["rollouts"] == 12
    assert metadata["env_name"] == "echo" and metadata["vfops_version"]
    dataset = load_results(run_dir)
    from_dataset = sorted((RolloutRecord.from_row(row) for row in dataset), key=lambda r: r.key)
    assert from_dataset == sorted(iter_records(run_dir), key=lambda r: r.key)
    assert dataset.features == rollout_features()


async def test_an_empty_arrow_export_reads_back_with_the_rollout_features(tmp_path: Path) -> None:
    sink = ArrowSink(tmp_path)
    await sink.close(RunFinish(status="failed", summary=EvalSummary()))
    dataset = load_results(tmp_path)
    assert len(dataset) == 0 and dataset.features == rollout_features()


async def test_the_arrow_export_keeps_every_value_of_every_row(tmp_path: Path) -> None:
    """Rows are converted by pyarrow's JSON reader: nulls, non-ASCII and control
    characters, quotes, large integers and a row longer than the reader's default
    block (1 MiB) come back exactly, across several batches."""
    from tests.test_rollout_record import sample_record

    huge = "x" * (3 << 20)
    records = [
        sample_record(rollout_index=0),
        sample_record(rollout_index=1, error=None, reward=None),
        sample_record(
            rollout_index=2,
            completion=[{"role": "assistant", "content": 'é "quoted" \\ \n\x00 ' + huge}],
            info={"big": 2**62, "nested": [1, {"a": None}]},
        ),
        *(sample_record(rollout_index=i) for i in range(3, 8)),
    ]
    sink = ArrowSink(tmp_path, batch_rows=3)
    for start in range(0, len(records), 2):
        await sink.write_group(records[start : start + 2])
    await sink.close(RunFinish(status="completed", summary=EvalSummary()))
    back = [RolloutRecord.from_row(row) for row in load_results(tmp_path)]
    assert back == records


async def test_resume_generates_only_missing_rollouts(tmp_path: Path) -> None:
    first = await run(make_env(), echo_client(), request(), tmp_path)
    assert first.run_dir is not None
    results = first.run_dir / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    # drop three records and leave a torn half line, as a kill -9 mid-write would
    results.write_bytes(b"".join(lines[:-3]) + lines[-3][:20])
    client = echo_client()
    result = await run(make_env(), client, request(), tmp_path, resume=first.run_dir)
    assert len(client.calls) == 3
    assert keys(first.run_dir) == [(e, i) for e in range(6) for i in range(2)]
    assert result.summary.rollouts == 12 and result.summary.new_rollouts == 3
    # the export is rebuilt from the whole folder, not only this session's rollouts
    assert len(load_results(first.run_dir)) == 12


async def test_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    first = await run(make_env(), echo_client(), request(r=1), tmp_path)
    with pytest.raises(VfopsError, match="rollouts_per_example was 1, now 2"):
        await run(make_env(), echo_client(), request(r=2), tmp_path, resume=first.run_dir)


async def test_cancel_keeps_completed_groups_and_resume_finishes(tmp_path: Path) -> None:
    env = make_env(20)
    answered = 0

    async def reply(messages: Messages, tools: object) -> str:
        nonlocal answered
        if answered >= 10:  # the rest wait until the run is cancelled: it stops midway
            await asyncio.Event().wait()
        answered += 1
        return str(messages[-1]["content"])

    client = ScriptedClient(reply)
    task = asyncio.create_task(run(env, client, request(n=20, r=2, c=4), tmp_path))
    # cancel once a group is on disk (a state, not a guess at how long that takes)
    folder = tmp_path / "evals" / "echo--scripted"
    for _ in range(6000):  # a 60 s safety net
        written = [p.read_bytes().count(b"\n") for p in folder.glob("*/results.jsonl")]
        if written and written[0] >= 2:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("no group reached results.jsonl")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (run_dir,) = (tmp_path / "evals" / "echo--scripted").iterdir()
    kept = keys(run_dir)
    assert 0 < len(kept) < 40
    assert read_metadata(run_dir)["status"] == "interrupted"
    # every kept group is whole: group scoring needs all of its rollouts
    assert all((e, 1 - i) in kept for e, i in kept)
    client = echo_client()
    await run(env, client, request(n=20, r=2, c=4), tmp_path, resume=run_dir)
    assert len(client.calls) == 40 - len(kept)
    assert keys(run_dir) == [(e, i) for e in range(20) for i in range(2)]


async def test_concurrency_is_bounded(tmp_path: Path) -> None:
    in_flight = 0
    peak = 0

    async def reply(messages: Messages, tools: object) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return str(messages[-1]["content"])

    await run(make_env(30), ScriptedClient(reply), request(n=30, r=3, c=5), tmp_path)
    assert peak == 5


async def test_errors_are_counted_not_scored(tmp_path: Path) -> None:
    def flaky(messages: Messages, tools: object) -> object:
        return ConnectionError("down") if messages[-1]["content"] in {"0", "1"} else "x"

    result = await run(make_env(4), ScriptedClient(flaky), request(n=4, r=1), tmp_path)
    summary = result.summary
    assert summary.rollouts == 4 and summary.reward.count == 2
    assert summary.errors == {"generation:ConnectionError": 2}
    assert summary.pass_at() == {1: 0.0}
    # each kind keeps a message: the cause, not only the class name
    assert summary.error_examples == {"generation:ConnectionError": "down"}
    assert result.run_dir is not None
    stored = read_metadata(result.run_dir)["summary"]
    assert stored["error_examples"] == {"generation:ConnectionError": "down"}


def test_pass_at_k_matches_the_combinatorial_definition() -> None:
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)


async def test_jsonl_lines_are_whole_records(tmp_path: Path) -> None:
    result = await run(make_env(3), echo_client(), request(n=3, r=2), tmp_path)
    assert result.run_dir is not None
    for line in (result.run_dir / "results.jsonl").read_bytes().splitlines():
        assert set(orjson.loads(line)) >= {"trace_id", "example_id", "reward", "completion"}


async def test_an_infinite_reward_is_an_error_on_its_rollout_not_a_score(tmp_path: Path) -> None:
    def infinite(completion: Messages, answer: str) -> float:
        return float("inf") if answer == "0" else 1.0

    rows = [{"question": f"{i}", "answer": str(i)} for i in range(3)]
    env = SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=Rubric(funcs=[infinite]))
    result = await run(env, echo_client(), request(n=3, r=1), tmp_path)
    by_example = {record.example_id: record for record in iter_records(result.run_dir)}
    bad = by_example[0]
    assert bad.reward is None and bad.error is not None
    assert bad.error.type == "InvalidReward" and "infinite" in bad.error.message
    assert "inf" in bad.error.message
    assert result.summary.errors == {"scoring:InvalidReward": 1}
    assert result.summary.reward.mean == 1.0  # the mean is over finite rewards only


async def test_two_resumes_of_one_folder_at_once_the_second_is_refused(tmp_path: Path) -> None:
    """Without the registry the run folder's lock keeps a second process (or task) off."""
    from vfops.evaluation import RunFolderBusyError

    first = await run(make_env(20), echo_client(), request(n=20, r=2), tmp_path)
    assert first.run_dir is not None
    results = first.run_dir / "results.jsonl"
    results.write_bytes(b"".join(results.read_bytes().splitlines(keepends=True)[:10]))
    generating = asyncio.Event()

    def reply(messages: Messages, tools: object) -> str:
        generating.set()  # the first resume holds the folder once it generates
        return str(messages[-1]["content"])

    slow, second = ScriptedClient(reply, delay_s=0.05), echo_client()
    resuming = asyncio.create_task(
        run(make_env(20), slow, request(n=20, r=2), tmp_path, resume=first.run_dir)
    )
    await generating.wait()
    with pytest.raises(RunFolderBusyError, match=r"is being worked on by pid \d+ on host"):
        await run(make_env(20), second, request(n=20, r=2), tmp_path, resume=first.run_dir)
    assert (await resuming).status == "completed"
    assert second.calls == [] and len(slow.calls) == 30
    assert keys(first.run_dir) == [(e, i) for e in range(20) for i in range(2)]
