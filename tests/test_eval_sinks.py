"""Sinks are passed in: a caller's own sink gets every scored group of a run.

The sink here is defined outside the package (only the documented
:class:`vfops.evaluation.Sink` protocol: ``name``, ``write_group``, ``close``); it
runs next to the run's own sinks (the run folder's export, and the registry when
there is one) through the one entry point, :func:`vfops.evaluation.evaluate_async`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset

from vfops._rollout import RolloutRecord
from vfops._types import Messages
from vfops.clients import ScriptedClient
from vfops.envs import SingleTurnEnv
from vfops.evaluation import (
    EvalRequest,
    RunFinish,
    RunOptions,
    Sink,
    evaluate_async,
    iter_records,
)
from vfops.rubrics import Rubric


def correct(completion: Messages, answer: str) -> float:
    return 1.0 if completion[-1]["content"] == answer else 0.0


class CollectingSink:
    """Keeps every group it is given, and how the run ended."""

    name = "collecting"

    def __init__(self) -> None:
        self.groups: list[list[RolloutRecord]] = []
        self.finish: RunFinish | None = None

    async def write_group(self, records: list[RolloutRecord]) -> None:
        self.groups.append(list(records))

    async def close(self, finish: RunFinish) -> None:
        self.finish = finish


def _env(n: int) -> SingleTurnEnv:
    rows = [{"question": f"{i}", "answer": str(i)} for i in range(n)]
    return SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=Rubric(funcs=[correct]))


@pytest.mark.parametrize("registry", [False, True])
async def test_a_sink_passed_in_receives_every_scored_group(tmp_path: Path, registry: bool) -> None:
    sink = CollectingSink()
    assert isinstance(sink, Sink)  # the documented protocol, nothing else
    options = RunOptions(output_root=tmp_path / "out", registry=registry, tracking=False)
    if registry:
        from vfops.registry import get_engine

        options = RunOptions(
            output_root=tmp_path / "out",
            tracking=False,
            engine=get_engine(f"sqlite:///{tmp_path / 'registry.db'}"),
        )
    client = ScriptedClient(lambda messages, tools: messages[-1]["content"])
    # the registry records an installed environment's provenance: one of the examples
    env_name = "arithmetic" if registry else "echo"
    request = EvalRequest(
        env_name=env_name, model="scripted", num_examples=5, rollouts_per_example=3
    )
    environment = None if registry else _env(5)
    result = await evaluate_async(
        request, options, environment=environment, client=client, sinks=[sink]
    )
    assert result.status == "completed", result.error
    assert result.run_dir is not None
    # one group per example, each whole (its rollouts together), every rollout once
    assert sorted(len(group) for group in sink.groups) == [3] * 5
    for group in sink.groups:
        assert len({record.example_id for record in group}) == 1
    received = sorted(record.key for group in sink.groups for record in group)
    assert received == sorted(record.key for record in iter_records(result.run_dir))
    if not registry:  # the echo environment: every rollout correct
        assert all(record.reward == 1.0 for group in sink.groups for record in group)
    # closed with the run's end, before it was recorded
    assert sink.finish is not None and sink.finish.status == "completed"
    assert sink.finish.summary.rollouts == 15
