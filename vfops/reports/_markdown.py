"""Markdown for sweep, nightly and training artifacts, as the Prefect UI renders it.

Prefect ships two UIs and both render markdown artifacts; what they do with text
decides what is written here (checked in a browser by tests/test_artifacts_browser.py):

- The V1 UI's renderer (marked, GFM) turns anything shaped like an e-mail address
  into a ``mailto:`` link: ``arithmetic@0.1.0``, ``NAME@1.2.3``. A backslash before
  the ``@`` (a markdown escape) renders as a plain ``@`` in both UIs; an HTML entity
  (``&#64;``) shows literally in V1. Every piece of text goes through
  :func:`escape_markdown`.
- Both render a markdown image whose source is a ``data:image/png`` URI: the charts
  live inside the report (:func:`markdown_image`), not in an image artifact, whose
  URL the UI prints as text across the page.
- Tables wider than the artifact pane scroll sideways (and the V2 UI gives every
  table-artifact column a fixed width): tables keep the key columns; the rest goes
  into a list under the table, which wraps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vfops.costs import format_cost
from vfops.reports._charts import (
    Z_95,
    env_label,
    model_label,
    png_data_uri,
    sampling_label,
)

if TYPE_CHECKING:
    from vfops.stats import RegressionReport

_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]<>|@])")
"""Characters escaped in text: markdown syntax, ``|`` (table cells), ``@`` (the V1 UI's
e-mail autolink). Not ``_``: names are full of it (``guess_number``) and GFM does not
emphasise inside words; the raw markdown stays greppable."""

EMAIL_AUTOLINK = re.compile(
    r"[A-Za-z0-9._+-]+@[a-zA-Z0-9_-]+(?:\.[a-zA-Z0-9_-]*[a-zA-Z0-9])+(?![-_])"
)
"""What marked (the V1 UI's markdown renderer, GFM on) turns into a ``mailto:`` link."""


def escape_markdown(text: str) -> str:
    """``text`` as markdown that renders as exactly that text, on one line, in a table
    cell or not: no emphasis, no HTML, no ``mailto:`` link for ``name@1.2.3``."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("\r", " ").replace("\n", " ")


def markdown_image(png: bytes, alt: str) -> str:
    """A PNG chart as a markdown image with a ``data:`` URI (both Prefect UIs render it)."""
    return f"![{escape_markdown(alt)}]({png_data_uri(png)})"


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.{digits}f}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_number(v, digits)}" for k, v in value.items())
    return escape_markdown(str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# --------------------------------------------------------------------------- sweep


def cost_line(cells: Sequence[Mapping[str, Any]]) -> str | None:
    """What the cells cost together: ``$0.4210``, ``$0.4210 (2 of 6 cells unpriced)``,
    or ``unpriced``; ``None`` when no cell says (results from before costs existed)."""
    known = [cell for cell in cells if "cost_usd" in cell and cell.get("run_id")]
    if not known:
        return None
    priced = [float(cell["cost_usd"]) for cell in known if cell["cost_usd"] is not None]
    if not priced:
        return "unpriced"
    total = format_cost(sum(priced))
    unpriced = len(known) - len(priced)
    return f"{total} ({unpriced} of {len(known)} cells unpriced)" if unpriced else total


def _failed(cell: Mapping[str, Any]) -> bool:
    return str(cell.get("status", "")).startswith("failed")


def _sweep_details(cell: Mapping[str, Any]) -> str:
    """Everything about a cell that is not a key column, as one list item."""
    parts: list[str] = []
    if cell.get("run_id"):
        action = f" ({escape_markdown(str(cell['action']))})" if cell.get("action") else ""
        parts.append(f"run `{cell['run_id']}`{action}")
    if cell.get("status"):
        parts.append(escape_markdown(str(cell.get("outcome") or cell["status"])))
    if cell.get("reward_stderr") is not None:
        parts.append(f"stderr {_number(cell['reward_stderr'], 4)}")
    if cell.get("pass_at_k"):
        parts.append(
            ", ".join(
                f"{escape_markdown(f'pass@{k}')} {_number(v)}" for k, v in cell["pass_at_k"].items()
            )
        )
    if cell.get("tokens") is not None:
        tokens = f"{_number(cell['tokens'])} tokens"
        if cell.get("prompt_tokens") is not None and cell.get("completion_tokens") is not None:
            tokens += (
                f" ({_number(cell['prompt_tokens'])} prompt, "
                f"{_number(cell['completion_tokens'])} completion)"
            )
        parts.append(tokens)
    if "cost_usd" in cell and cell.get("run_id"):
        parts.append(f"cost {escape_markdown(format_cost(cell['cost_usd']))}")
    if cell.get("model_alias") and cell.get("model") and cell["model"] != cell["model_alias"]:
        parts.append(f"model {escape_markdown(str(cell['model']))}")
    if cell.get("flow_run"):
        link = str(cell["flow_run"])
        parts.append(f"[flow run]({link})" if "://" in link else f"flow run `{link}`")
    for note in [*cell.get("notes", []), cell.get("error")]:
        if note:
            parts.append(escape_markdown(str(note)))
    head = " / ".join(
        escape_markdown(label)
        for label in (env_label(cell), model_label(cell), sampling_label(cell))
    )
    return f"- **{head}**: " + "; ".join(parts) if parts else ""


def sweep_markdown(
    cells: Sequence[Mapping[str, Any]], chart_png: bytes | None = None, *, title: str = "Eval sweep"
) -> str:
    """A markdown report of a sweep: the chart, a table of the key columns (one row per
    cell: environment, model, sampling, reward, its 95 % CI, rollouts, errors), then
    one list item per cell with the rest (run id, pass@k, tokens, notes, errors)."""
    headers = ["environment", "model", "sampling", "reward", "95% CI (±1.96 stderr)"]
    # rollouts: the run's total, N examples x R rollouts each
    optional = {"rollouts": "rollouts (N×R)", "errors": "errors"}
    extra = [key for key in optional if any(cell.get(key) is not None for cell in cells)]
    headers += [optional[key] for key in extra]
    rows = []
    for cell in cells:
        mean = cell.get("reward_mean")
        stderr = cell.get("reward_stderr")
        if isinstance(mean, int | float) and isinstance(stderr, int | float):
            ci = f"[{mean - Z_95 * stderr:.3f}, {mean + Z_95 * stderr:.3f}]"
        else:
            ci = "–"
        row = [
            escape_markdown(env_label(cell)),
            escape_markdown(model_label(cell)),
            escape_markdown(sampling_label(cell)),
            "**failed**" if _failed(cell) else _number(mean),
            ci,
        ]
        row += [_number(cell.get(key)) for key in extra]
        rows.append(row)
    cost = cost_line(cells)
    spent = f" Cost: {escape_markdown(cost)}." if cost is not None else ""
    parts = [f"# {escape_markdown(title)}", "", f"{_plural(len(cells), 'cell')}.{spent}"]
    if chart_png is not None:
        parts += ["", markdown_image(chart_png, "reward per cell")]
    parts += ["", _table(headers, rows) if rows else "_No cells._", ""]
    details = [line for line in (_sweep_details(cell) for cell in cells) if line]
    if details:
        parts += ["## Cells", "", *details, ""]
    return "\n".join(parts)


# --------------------------------------------------------------------------- nightly


def regression_markdown(
    reports: Sequence[tuple[str, RegressionReport]],
    chart_png: bytes | None = None,
    *,
    title: str = "Nightly regression check",
) -> str:
    """A markdown report of nightly comparisons: regressions first and in bold.

    Each row states the noise floor the verdict was measured against; a list below
    the table gives each cell's one-line summary (test, CI, p, McNemar, noise floor
    and how it was measured, examples compared).
    """
    order = {"regression": 0, "within noise": 1, "below min effect": 2, "improvement": 3}
    ranked = sorted(reports, key=lambda item: (order.get(item[1].verdict, 4), item[1].delta))
    regressions = [label for label, report in ranked if report.regressed]
    if regressions:
        headline = (
            f"**{_plural(len(regressions), 'regression')}** in {_plural(len(reports), 'cell')}: "
            + ", ".join(f"**{escape_markdown(label)}**" for label in regressions)
            + "."
        )
    else:
        headline = f"No regressions in {_plural(len(reports), 'cell')}."
    headers = ["cell", "verdict", "reward (previous → now)", "Δ", "95% CI", "noise floor"]
    rows = []
    for label, report in ranked:
        ci_pct = f"{(1 - report.alpha) * 100:g}%"
        row = [
            escape_markdown(label),
            report.verdict.upper() if report.regressed else report.verdict,
            f"{report.mean_a:.3f} → {report.mean_b:.3f}",
            f"{report.delta:+.3f}",
            f"[{report.ci_low:+.3f}, {report.ci_high:+.3f}]"
            + ("" if ci_pct == "95%" else f" ({ci_pct})"),
            "none (no variance)"
            if report.noise_floor.no_variance
            else f"±{report.noise_floor.value:.3f}",
        ]
        if report.regressed:
            row = [f"**{cell}**" for cell in row]
        rows.append(row)
    parts = [f"# {escape_markdown(title)}", "", headline]
    if chart_png is not None:
        parts += ["", markdown_image(chart_png, "nightly reward trend")]
    parts += ["", _table(headers, rows) if rows else "_No cells compared._", ""]
    if ranked:
        parts += [
            "A cell is flagged when its drop is statistically significant (paired bootstrap "
            "over examples; exact McNemar for pass/fail rewards) and larger than its noise "
            "floor, which is measured from the previous run's own rollouts, not assumed.",
            "",
        ]
        for label, report in ranked:
            text = (
                f"{escape_markdown(label)} ({_plural(report.n_examples, 'example')}): "
                f"{escape_markdown(report.summary)}"
            )
            parts.append(f"- **{text}**" if report.regressed else f"- {text}")
        parts.append("")
    return "\n".join(parts)


def nightly_markdown(
    comparisons: Sequence[Any],
    chart_png: bytes | None = None,
    *,
    night: str | None = None,
    pinned: Mapping[str, str] | None = None,
    cost: str | None = None,
) -> str:
    """The nightly report: :func:`regression_markdown` of the compared cells, then the
    models pinned for the night, the baselines and each cell's run ids.

    ``comparisons``: :class:`vfops.nightly.CellComparison` (``label``, ``run_id``,
    ``previous_run_id``, ``report``). ``cost``: what the night cost (:func:`cost_line`).
    """
    title = "Nightly regression check" + (f" for {night}" if night else "")
    reports = [(c.label, c.report) for c in comparisons if c.report is not None]
    if reports:
        markdown = regression_markdown(reports, chart_png, title=title)
    else:
        markdown = f"# {escape_markdown(title)}\n"
        if chart_png is not None:
            markdown += "\n" + markdown_image(chart_png, "nightly reward trend") + "\n"
    if cost is not None:
        markdown += f"\nThis night cost {escape_markdown(cost)}.\n"
    if pinned:
        markdown += "\nModels this night: " + ", ".join(
            f"{escape_markdown(ref)} = {escape_markdown(version)}"
            for ref, version in sorted(pinned.items())
        )
        markdown += "\n"
    baselines = [c.label for c in comparisons if c.report is None]
    if baselines:
        markdown += "\nFirst nightly run (baseline, nothing to compare): " + ", ".join(
            escape_markdown(label) for label in baselines
        )
        markdown += "\n"
    if comparisons:
        markdown += "\n## Runs\n\n"
        for c in comparisons:
            previous = f", previous `{c.previous_run_id}`" if c.previous_run_id else ""
            markdown += f"- {escape_markdown(c.label)}: run `{c.run_id}`{previous}\n"
    return markdown


def nightly_table(cells: Sequence[tuple[Mapping[str, Any], Any]]) -> list[dict[str, Any]]:
    """Rows of the nightly table artifact: the key columns of each compared cell.

    ``cells``: ``(cell result, comparison)`` pairs. The version has its own column: a
    ``name@1.2.3`` in a table cell becomes a ``mailto:`` link in the V1 UI, which renders
    table cells as markdown (and the V2 UI as plain text, so no escape suits both).
    """
    rows = []
    for result, comparison in cells:
        report = comparison.report
        rows.append(
            {
                "environment": str(result.get("env", "?")),
                "version": str(result.get("version", "")),
                "model": model_label(result),
                "sampling": str(result.get("sampling", "")),
                "verdict": "baseline" if report is None else report.verdict,
                "Δ reward": None if report is None else round(report.delta, 4),
                "noise floor": None if report is None else round(report.noise_floor.value, 4),
            }
        )
    return rows


# --------------------------------------------------------------------------- training


class RewardCurve:
    """Collects a training run's progress events (``progress(kind, step, metrics)``, see
    :func:`vfops.training.train`) into the points of its reward curve."""

    def __init__(self) -> None:
        self.train: list[tuple[int, float]] = []
        self.held_out: list[tuple[int, float]] = []

    def __call__(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        if kind == "eval" and "eval_reward" in metrics:
            self.held_out.append((step, float(metrics["eval_reward"])))
        elif kind == "step" and "reward_mean" in metrics:
            self.train.append((step, float(metrics["reward_mean"])))

    def chart(self) -> bytes | None:
        """The PNG chart, or None before the first point."""
        if not self.train and not self.held_out:
            return None
        from vfops.reports._charts import training_curve_chart

        return training_curve_chart(self.train, self.held_out)


def training_markdown(
    config_path: str, summary: Mapping[str, Any], chart_png: bytes | None = None
) -> str:
    """The ``train-grpo`` report: the held-out reward before and after, the reward curve
    (train and held-out per step), the checkpoint and the registered model."""
    registered = summary.get("registered")
    lines = [
        f"# GRPO training: `{config_path}`",
        "",
        "| baseline held-out reward | final held-out reward | steps |",
        "|---|---|---|",
        f"| {_number(summary.get('baseline_eval_reward'), 4)} "
        f"| {_number(summary.get('final_eval_reward'), 4)} | {_number(summary.get('steps'))} |",
        "",
    ]
    if chart_png is not None:
        lines += [markdown_image(chart_png, "reward per step"), ""]
    lines += [
        f"- checkpoint: `{summary.get('checkpoint')}`",
        f"- registered model: {f'`{registered}`' if registered else '–'}",
    ]
    if summary.get("mlflow_run_id"):
        lines.append(f"- MLflow run: `{summary['mlflow_run_id']}`")
    return "\n".join(lines) + "\n"
