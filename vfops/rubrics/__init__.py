"""Rubrics: reward functions that score the rollouts of one example."""

from vfops.rubrics._judge import (
    DEFAULT_JUDGE_PROMPT,
    InMemoryJudgeCache,
    JudgeCache,
    JudgeOptions,
    JudgeRubric,
    judge_cache_key,
    judge_says_yes,
)
from vfops.rubrics._math import MathRubric
from vfops.rubrics._memory_guard import memory_error, scoring_in_process
from vfops.rubrics._rubric import Rubric
from vfops.rubrics._rubric_group import RubricGroup
from vfops.rubrics._score import RolloutScore
from vfops.rubrics._tool_metrics import ToolMetricsRubric
from vfops.rubrics._workers import (
    Contained,
    ContainedCall,
    ScoringWorkers,
    WorkerFailure,
    register_contained,
    run_contained,
    start_scoring_workers,
)

__all__ = [
    "DEFAULT_JUDGE_PROMPT",
    "Contained",
    "ContainedCall",
    "InMemoryJudgeCache",
    "JudgeCache",
    "JudgeOptions",
    "JudgeRubric",
    "MathRubric",
    "RolloutScore",
    "Rubric",
    "RubricGroup",
    "ScoringWorkers",
    "ToolMetricsRubric",
    "WorkerFailure",
    "judge_cache_key",
    "judge_says_yes",
    "memory_error",
    "register_contained",
    "run_contained",
    "scoring_in_process",
    "start_scoring_workers",
]
