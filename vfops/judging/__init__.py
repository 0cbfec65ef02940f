"""Judge scoring of registry runs: re-score a run's rollouts through the judge cache."""

from vfops.judging._rescore import (
    RescoreResult,
    RolloutJudgement,
    rescore_run,
    resolve_run_id,
    yes_no_score,
)
from vfops.judging._spec import (
    JudgeScorePlan,
    JudgeScoreSpec,
    artifact_key,
    judge_score_markdown,
    judge_score_table,
    make_judge_rubric,
    plan_judge_score,
    run_judge_score,
)

__all__ = [
    "JudgeScorePlan",
    "JudgeScoreSpec",
    "RescoreResult",
    "RolloutJudgement",
    "artifact_key",
    "judge_score_markdown",
    "judge_score_table",
    "make_judge_rubric",
    "plan_judge_score",
    "rescore_run",
    "resolve_run_id",
    "run_judge_score",
    "yes_no_score",
]
