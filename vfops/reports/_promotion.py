"""The promotion reports: the evidence gate's decision as markdown for the Prefect UI.

Built here, beside the other reports, from the decision objects ``vfops.models`` returns
(typed for the checker only: reports sit below models and never import them). Ids,
``name@alias`` and versions go in code spans: Prefect's markdown would make them
``mailto:`` links.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vfops.models import LoopResult, PromotionDecision


def report_key(prefix: str, model_name: str) -> str:
    """A Prefect artifact key per model (keys allow lowercase letters, digits, dashes)."""
    return f"{prefix}-{re.sub('[^a-z0-9]+', '-', model_name.lower()).strip('-')}"


def gate_table(decision: PromotionDecision) -> list[str]:
    """The gate's evidence as markdown table lines, one row per gate environment."""
    lines = [
        "| environment | candidate run | holder run | delta | verdict |",
        "|---|---|---|---|---|",
    ]
    for r in decision.envs:
        delta = "-" if r.delta is None else f"{r.delta:+.3f}"
        lines.append(
            f"| `{r.env}` | `{r.candidate_run_id}` | `{r.holder_run_id or '-'}` | {delta} "
            f"| {r.verdict or '-'} |"
        )
    return lines


def promotion_markdown(name: str, decision: PromotionDecision) -> str:
    """The ``promote-checkpoint`` report: the outcome, the previous holder, the evidence."""
    lines = [
        f"# {decision.outcome.upper()}{' (forced)' if decision.forced else ''}: "
        f"`{name}` v{decision.to_version} -> @{decision.alias}",
        "",
        f"Previous holder: {('v' + decision.from_version) if decision.from_version else 'none'}",
        "",
    ]
    lines += gate_table(decision)
    lines += ["", decision.reason]
    return "\n".join(lines) + "\n"


def loop_markdown(result: LoopResult, mlflow_run: str) -> str:
    """The ``train-evaluate-promote`` report: training's held-out reward, then the gate.
    ``mlflow_run``: the training's MLflow run as markdown (a link where there is a UI)."""
    training, decision = result.training, result.decision
    lines = [
        f"# `{result.model_uri}`: {decision.outcome}"
        f"{' (forced)' if decision.forced else ''} for `@{decision.alias}`",
        "",
        f"Held-out reward during training: {training.baseline_eval_reward:.4f} -> "
        f"{training.final_eval_reward:.4f} after {training.steps} steps "
        f"(MLflow run {mlflow_run}).",
        "",
    ]
    lines += gate_table(decision)
    lines += ["", decision.reason]
    return "\n".join(lines) + "\n"
