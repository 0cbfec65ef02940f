"""Markdown for sweep and nightly-regression artifacts (Prefect renders markdown)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vfops.reports._charts import Z_95, format_sampling, png_data_uri

if TYPE_CHECKING:
    from vfops.stats import RegressionReport

# Optional sweep-cell columns, shown when any cell has them: key -> header.
_OPTIONAL_COLUMNS: dict[str, str] = {
    "n": "N",
    "rollouts": "R",
    "pass_at_k": "pass@k",
    "errors": "errors",
    "tokens": "tokens",
    "run_id": "run",
}


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


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
    return _escape(str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _image(png: bytes, alt: str) -> str:
    return f"![{alt}]({png_data_uri(png)})"


def sweep_markdown(
    cells: Sequence[Mapping[str, Any]], chart_png: bytes | None = None, *, title: str = "Eval sweep"
) -> str:
    """A markdown report of a sweep: optional chart, then one table row per cell."""
    extra = [key for key in _OPTIONAL_COLUMNS if any(key in cell for cell in cells)]
    headers = ["environment", "model", "sampling", "reward", "95% CI (±1.96 stderr)", "stderr"]
    headers += [_OPTIONAL_COLUMNS[key] for key in extra]
    rows = []
    for cell in cells:
        mean = cell.get("reward_mean")
        stderr = cell.get("reward_stderr")
        if isinstance(mean, int | float) and isinstance(stderr, int | float):
            ci = f"[{mean - Z_95 * stderr:.3f}, {mean + Z_95 * stderr:.3f}]"
        else:
            ci = "–"
        row = [
            _escape(str(cell.get("env", "?"))),
            _escape(str(cell.get("model", "?"))),
            _escape(format_sampling(cell.get("sampling"))),
            _number(mean),
            ci,
            _number(stderr, 4),
        ]
        row += [_number(cell.get(key)) for key in extra]
        rows.append(row)
    parts = [f"# {title}", "", f"{len(cells)} cell{'s' if len(cells) != 1 else ''}."]
    if chart_png is not None:
        parts += ["", _image(chart_png, "reward per cell")]
    parts += ["", _table(headers, rows) if rows else "_No cells._", ""]
    return "\n".join(parts)


def regression_markdown(
    reports: Sequence[tuple[str, RegressionReport]],
    chart_png: bytes | None = None,
    *,
    title: str = "Nightly regression check",
) -> str:
    """A markdown report of nightly comparisons: regressions first and in bold.

    Each row states the noise floor the verdict was measured against, and a list
    below the table gives each cell's one-line summary (test, CI, p, noise floor
    and how it was measured).
    """
    from vfops.stats import format_p

    order = {"regression": 0, "within noise": 1, "below min effect": 2, "improvement": 3}
    ranked = sorted(reports, key=lambda item: (order.get(item[1].verdict, 4), item[1].delta))
    regressions = [label for label, report in ranked if report.regressed]
    if regressions:
        headline = (
            f"**{len(regressions)} regression{'s' if len(regressions) != 1 else ''}** in "
            f"{len(reports)} cell{'s' if len(reports) != 1 else ''}: "
            + ", ".join(f"**{_escape(label)}**" for label in regressions)
            + "."
        )
    else:
        headline = f"No regressions in {len(reports)} cell{'s' if len(reports) != 1 else ''}."
    headers = [
        "cell",
        "verdict",
        "reward (previous → now)",
        "Δ",
        "95% CI",
        "p",
        "McNemar p",
        "noise floor",
        "examples",
    ]
    rows = []
    for label, report in ranked:
        ci_pct = f"{(1 - report.alpha) * 100:g}%"
        row = [
            _escape(label),
            report.verdict.upper() if report.regressed else report.verdict,
            f"{report.mean_a:.3f} → {report.mean_b:.3f}",
            f"{report.delta:+.3f}",
            f"[{report.ci_low:+.3f}, {report.ci_high:+.3f}]"
            + ("" if ci_pct == "95%" else f" ({ci_pct})"),
            format_p(report.p_value).removeprefix("p="),
            format_p(report.mcnemar.p_value).removeprefix("p=") if report.mcnemar else "–",
            f"±{report.noise_floor.value:.3f} ({report.noise_floor.method})",
            str(report.n_examples),
        ]
        if report.regressed:
            row = [f"**{cell}**" for cell in row]
        rows.append(row)
    parts = [f"# {title}", "", headline]
    if chart_png is not None:
        parts += ["", _image(chart_png, "nightly reward trend")]
    parts += ["", _table(headers, rows) if rows else "_No cells compared._", ""]
    if ranked:
        parts += [
            "A cell is flagged when its drop is statistically significant (paired bootstrap "
            "over examples; exact McNemar for pass/fail rewards) and larger than its noise "
            "floor, which is measured from the previous run's own rollouts, not assumed.",
            "",
        ]
        for label, report in ranked:
            text = f"{_escape(label)}: {_escape(report.summary)}"
            parts.append(f"- **{text}**" if report.regressed else f"- {text}")
        parts.append("")
    return "\n".join(parts)
