"""vfops.reports: PNG charts and markdown for sweep and nightly artifacts."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from datetime import date, datetime
from typing import Any

import numpy as np
import pytest

from vfops.reports import (
    EMAIL_AUTOLINK,
    PNG_MAGIC,
    RewardCurve,
    cost_line,
    escape_markdown,
    markdown_image,
    nightly_markdown,
    nightly_table,
    nightly_trend_chart,
    png_data_uri,
    regression_markdown,
    sweep_chart,
    sweep_markdown,
    training_curve_chart,
    training_markdown,
)
from vfops.stats import compare_runs_statistically


def cells() -> list[dict[str, Any]]:
    return [
        {
            "env": "gsm8k@1.2.0",
            "model": model,
            "sampling": {"temperature": temperature},
            "reward_mean": mean,
            "reward_stderr": 0.03,
            "errors": 2,
            "tokens": 12345,
        }
        for model, temperature, mean in [
            ("qwen-small", 0.7, 0.41),
            ("qwen-small", 1.0, 0.37),
            ("llama-8b", 0.7, 0.62),
        ]
    ]


def decode_png(png: bytes) -> np.ndarray:
    import matplotlib.image

    assert png.startswith(PNG_MAGIC)
    image: np.ndarray = matplotlib.image.imread(io.BytesIO(png), format="png")
    return image


def test_sweep_chart_is_a_sensible_png() -> None:
    image = decode_png(sweep_chart(cells()))
    height, width = image.shape[:2]
    assert 300 <= height <= 2000 and 500 <= width <= 4000
    assert image.std() > 0.01  # something was drawn


def test_sweep_chart_leaves_no_pyplot_state() -> None:
    code = (
        "import sys\n"
        "from vfops.reports import sweep_chart\n"
        "png = sweep_chart([{'env': 'e', 'model': 'm', 'sampling': None,"
        " 'reward_mean': 0.5, 'reward_stderr': 0.1}])\n"
        "assert png[:4] == b'\\x89PNG'\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_nightly_trend_chart_mixes_dates_and_strings() -> None:
    history: dict[str, list[tuple[date | datetime | str, float, float | None]]] = {
        "gsm8k": [(date(2025, 1, d), 0.6 + 0.01 * d, 0.02) for d in range(1, 8)],
        "wordle": [(f"2025-01-0{d}", 0.4, None) for d in range(3, 8)],
    }
    image = decode_png(nightly_trend_chart(history))
    assert image.shape[0] >= 300 and image.shape[1] >= 500
    with pytest.raises(ValueError):
        nightly_trend_chart({})


def _layout_of_each_chart(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Where each chart drawn in the block put its title, its legend and its axes (pixels,
    as rendered into the PNG)."""
    from vfops.reports import _charts

    layouts: list[dict[str, Any]] = []
    to_png = _charts._to_png

    def measured(fig: Any) -> bytes:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (ax,) = fig.axes
        layouts.append(
            {
                "figure": fig.bbox,
                "title": ax.title.get_window_extent(renderer),
                "axes": ax.get_window_extent(renderer),
                "legends": [legend.get_window_extent(renderer) for legend in fig.legends],
            }
        )
        return to_png(fig)

    monkeypatch.setattr(_charts, "_to_png", measured)
    return layouts


def test_no_legend_covers_a_title_or_squeezes_the_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    # the demo's nightly chart: its series name pushed a legend at the top right over the
    # title's end, and the axes shrank to a third of the figure
    from vfops.reports._charts import training_curve_chart

    layouts = _layout_of_each_chart(monkeypatch)
    demo = "lucky_digit · models:/vfops-demo-policy@champion"
    nightly_trend_chart({demo: [("2026-12-05", 0.0, 0.0), ("2026-12-06", 1.0, 0.0)]})
    nightly_trend_chart(
        {f"env{i} · models:/a-model@champion": [("2026-12-06", 0.1 * i, 0.01)] for i in range(8)}
    )
    sweep_chart(cells())
    training_curve_chart([(1, 0.1), (2, 0.3)], [(0, 0.0), (2, 0.5)])
    assert len(layouts) == 4
    for layout in layouts:
        title, axes, figure = layout["title"], layout["axes"], layout["figure"]
        assert layout["legends"], "each of these charts has a legend"
        for legend in layout["legends"]:
            assert not legend.overlaps(title), (legend, title)
            assert not legend.overlaps(axes), (legend, axes)
            assert figure.x0 <= legend.x0 and legend.x1 <= figure.x1 + 1, (legend, figure)
        assert figure.x0 <= title.x0 and title.x1 <= figure.x1, (title, figure)
        assert axes.width >= 0.6 * figure.width, (axes, figure)
        assert axes.height >= 0.35 * figure.height, (axes, figure)


def test_png_data_uri_round_trips() -> None:
    png = sweep_chart(cells())
    uri = png_data_uri(png)
    assert uri.startswith("data:image/png;base64,")
    assert base64.b64decode(uri.removeprefix("data:image/png;base64,")) == png
    with pytest.raises(ValueError):
        png_data_uri(b"not a png")


def test_sweep_markdown_lists_every_cell_and_embeds_chart() -> None:
    png = sweep_chart(cells())
    md = sweep_markdown(cells(), chart_png=png)
    for cell in cells():
        assert cell["model"] in md
    assert "gsm8k\\@1.2.0" in md and "t=0.7" in md
    assert "| 0.620 | [0.561, 0.679] | 2 |" in md  # mean, ±1.96 stderr, errors
    assert "12,345 tokens" in md and "errors" in md  # tokens: below the table
    assert f"![reward per cell]({png_data_uri(png)})" in md
    assert "![" not in sweep_markdown(cells())


def sweep_result(**overrides: Any) -> dict[str, Any]:
    """A cell as the eval-sweep flow has it (CellResult.to_json())."""
    return {
        "cell": "arithmetic@latest / stub / cold",
        "env": "arithmetic",
        "env_ref": "arithmetic@latest",
        "version": "0.1.0",
        "model_alias": "stub",
        "model": "stub-model",
        "sampling": "cold",
        "sampling_args": {"temperature": 0.0},
        "run_id": "0123abcd",
        "action": "created",
        "status": "completed",
        "outcome": "completed",
        "rollouts": 6,
        "reward_mean": 0.5,
        "reward_stderr": 0.1,
        "pass_at_k": {"1": 0.5, "2": 0.66},
        "errors": 0,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "tokens": 120,
        "notes": ["installed arithmetic@0.1.0"],
        **overrides,
    }


def test_sweep_markdown_key_columns_in_the_table_the_rest_below() -> None:
    failed = {
        "cell": "arithmetic@0.1.0 / down / cold",
        "env_ref": "arithmetic@0.1.0",
        "model_alias": "down",
        "sampling": "cold",
        "status": "failed",
        "error": "cannot reach http://127.0.0.1:9/v1",
    }
    md = sweep_markdown([sweep_result(), failed])
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert table[0] == (
        "| environment | model | sampling | reward | 95% CI (±1.96 stderr) | rollouts (N×R) "
        "| errors |"
    )
    # the model is the alias the sweep named, as in the table artifact and the chart
    assert table[2] == (
        "| arithmetic\\@0.1.0 | stub | cold (t=0.0) | 0.500 | [0.304, 0.696] | 6 | 0 |"
    )
    assert table[3].startswith("| arithmetic\\@0.1.0 | down | cold | **failed** | – |")
    details = md[md.index("## Cells") :]
    assert "run `0123abcd` (created)" in details and "pass\\@1 0.500, pass\\@2 0.660" in details
    assert "120 tokens (100 prompt, 20 completion)" in details and "model stub-model" in details
    assert "installed arithmetic\\@0.1.0" in details and "cannot reach" in details
    assert not EMAIL_AUTOLINK.search(md.replace("\\@", "")), "an unescaped name@version"


def test_escape_markdown_leaves_no_autolink_and_no_markup() -> None:
    for text in ["arithmetic@0.1.0", "NAME@1.2.3", "a|b", "x*z*", "<b>", "`c`", "[l](u)"]:
        escaped = escape_markdown(text)
        assert not EMAIL_AUTOLINK.search(escaped), escaped
        # every special character is backslash-escaped: renders as the text itself
        assert escaped.replace("\\", "") == text
    assert escape_markdown("two\nlines") == "two lines"
    assert escape_markdown("guess_number") == "guess_number"  # no emphasis inside words
    assert EMAIL_AUTOLINK.search("arithmetic@0.1.0")  # the pattern does match the raw text


def test_markdown_image_embeds_the_png() -> None:
    png = sweep_chart(cells())
    assert markdown_image(png, "chart") == f"![chart]({png_data_uri(png)})"
    with pytest.raises(ValueError):
        markdown_image(b"GIF89a", "not a png")


def test_training_curve_chart_and_report() -> None:
    curve = RewardCurve()
    assert curve.chart() is None
    curve("eval", 0, {"eval_reward": 0.2})
    for step in range(1, 11):
        curve("step", step, {"reward_mean": 0.1 * step, "loss": 0.0})
        if step % 5 == 0:
            curve("eval", step, {"eval_reward": 0.2 + 0.05 * step})
    assert curve.train[-1] == (10, 1.0) and curve.held_out == [(0, 0.2), (5, 0.45), (10, 0.7)]
    png = curve.chart()
    assert png is not None
    image = decode_png(png)
    assert image.shape[0] >= 300 and image.shape[1] >= 500 and image.std() > 0.01
    decode_png(training_curve_chart([(1, 0.5)]))  # one series is enough
    with pytest.raises(ValueError):
        training_curve_chart([], [])

    summary = {
        "baseline_eval_reward": 0.2,
        "final_eval_reward": 0.7,
        "steps": 10,
        "checkpoint": "/out/final",
        "registered": "models:/tiny@x/1",
        "mlflow_run_id": "abc",
    }
    md = training_markdown("configs/train/x.toml", summary, png)
    assert md.startswith("# GRPO training: `configs/train/x.toml`")
    assert "| 0.2000 | 0.7000 | 10 |" in md
    assert f"![reward per step]({png_data_uri(png)})" in md
    assert "`models:/tiny@x/1`" in md  # code span: never a link
    assert "![" not in training_markdown("x.toml", summary)


def bernoulli(rng: np.random.Generator, n: int, r: int, p: float) -> dict[int, list[float]]:
    return {i: [float(x) for x in rng.random(r) < p] for i in range(n)}


def test_regression_markdown_puts_regressions_first_in_bold_with_noise_floors() -> None:
    rng = np.random.default_rng(0)
    a = bernoulli(rng, 200, 4, 0.7)
    dropped = {k: ([0.0] * 4 if k < 40 else v) for k, v in a.items()}
    noisy = bernoulli(rng, 200, 4, 0.7)
    steady = compare_runs_statistically(a, noisy, iterations=2_000)
    regressed = compare_runs_statistically(a, dropped, iterations=2_000)
    assert regressed.regressed and not steady.regressed

    md = regression_markdown(
        [("wordle / qwen / t=0.7", steady), ("gsm8k / qwen / t=0.7", regressed)],
        chart_png=nightly_trend_chart({"gsm8k": [("2025-01-01", 0.7, 0.02)]}),
    )
    assert "**1 regression** in 2 cells: **gsm8k / qwen / t=0.7**." in md
    rows = [line for line in md.splitlines() if line.startswith("| ")][1:]
    assert rows[0].startswith("| **gsm8k / qwen / t=0.7** | **REGRESSION** |")
    assert rows[1].startswith("| wordle / qwen / t=0.7 |")
    assert rows[0].endswith(f"**±{regressed.noise_floor.value:.3f}** |")
    assert len(rows[0].split(" | ")) == 6  # key columns only: it fits the pane
    assert "measured from the previous run's own rollouts, not assumed" in md
    assert "gsm8k / qwen / t=0.7 (200 examples): reward" in md  # the rest: below
    assert md.count("measured by split-half resampling of the baseline") == 2
    assert "data:image/png;base64," in md

    assert "No regressions in 1 cell." in regression_markdown([("x", steady)])


def test_a_baseline_without_variance_is_reported_as_such() -> None:
    """An all-zero baseline (a model that never scores) has no spread: the report says
    so rather than a noise floor of ±0.000 and "detects drops ≥ 0.000 with 80% power"
    (a spread of zero says nothing of how a drop would spread: no power to quote)."""
    zeros = {i: [0.0] for i in range(64)}
    flat = compare_runs_statistically(zeros, zeros, iterations=500)
    assert flat.noise_floor.no_variance and flat.min_detectable_effect is None
    assert flat.verdict == "no change"
    assert "the baseline has no variance (its 64 examples, one rollout each, scored alike)" in (
        flat.summary
    )
    assert flat.summary.endswith("; power not estimable: NO CHANGE")
    assert "±0.000" not in flat.summary and "0.000 with 80% power" not in flat.summary
    md = regression_markdown([("lucky_digit / base", flat)])
    (row,) = [line for line in md.splitlines() if line.startswith("| lucky")]
    assert row.endswith("| none (no variance) |"), row
    assert "±0.000" not in md and "80% power" not in md
    assert json.loads(json.dumps(flat.to_dict()))["min_detectable_effect"] is None
    # split-half: rollouts that agree within each example (greedy decoding) are no noise
    greedy = {i: [float(i % 2)] * 2 for i in range(20)}
    dropped = compare_runs_statistically(greedy, {i: [0.0, 0.0] for i in range(20)})
    assert dropped.verdict == "regression"  # a real drop is still flagged
    assert "no sampling noise in the baseline (the 2 rollouts of each of its 20 examples" in (
        dropped.summary
    )
    # a baseline that varies keeps its measured floor and its power
    rng = np.random.default_rng(0)
    varied = compare_runs_statistically(bernoulli(rng, 50, 2, 0.5), bernoulli(rng, 50, 2, 0.5))
    assert not varied.noise_floor.no_variance and varied.min_detectable_effect is not None
    assert "with 80% power" in varied.summary and "noise floor ±" in varied.summary


class _Comparison:
    def __init__(self, label: str, run_id: str, previous: str | None, report: Any) -> None:
        self.label, self.run_id, self.previous_run_id, self.report = label, run_id, previous, report


def test_nightly_markdown_and_table() -> None:
    rng = np.random.default_rng(1)
    a = bernoulli(rng, 50, 2, 0.6)
    report = compare_runs_statistically(a, bernoulli(rng, 50, 2, 0.6), iterations=500)
    comparisons = [
        _Comparison("arithmetic@0.1.0 · stub · default", "run-2", "run-1", report),
        _Comparison("guess@0.2.0 · stub · default", "run-3", None, None),
    ]
    chart = nightly_trend_chart({"arithmetic · stub": [("2026-11-01", 0.6, 0.02)]})
    md = nightly_markdown(
        comparisons, chart, night="2026-11-02", pinned={"models:/t@champion": "models:/t/2"}
    )
    assert md.startswith("# Nightly regression check for 2026-11-02")
    assert "![nightly reward trend](data:image/png;base64," in md
    assert "Models this night: models:/t\\@champion = models:/t/2" in md
    assert "First nightly run (baseline, nothing to compare): guess\\@0.2.0" in md
    assert "run `run-2`, previous `run-1`" in md and "run `run-3`" in md
    assert not EMAIL_AUTOLINK.search(md.replace("\\@", ""))
    assert nightly_markdown(comparisons[1:]).startswith("# Nightly regression check\n")

    results = [
        {"env": "arithmetic", "version": "0.1.0", "model_alias": "stub", "sampling": "default"},
        {"env": "guess", "version": "0.2.0", "model_alias": "stub", "sampling": "default"},
    ]
    rows = nightly_table(list(zip(results, comparisons, strict=True)))
    assert list(rows[0]) == [
        "environment",
        "version",
        "model",
        "sampling",
        "verdict",
        "Δ reward",
        "noise floor",
    ]
    assert rows[0]["verdict"] == report.verdict and rows[1]["verdict"] == "baseline"
    # no name@version anywhere in a table cell: the V1 UI renders cells as markdown
    assert not any(EMAIL_AUTOLINK.search(str(v)) for row in rows for v in row.values())


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def test_deployment_forms_have_no_autolinked_versions() -> None:
    """The V1 UI renders a deployment's description and its run form's parameter
    descriptions as markdown: a ``NAME@1.2.3`` there is a ``mailto:`` link (and in the V2
    UI they are plain text, where an escape would show), so they must not have one."""
    import importlib

    from vfops.orchestration import deployment_specs

    specs = deployment_specs(nightly_parameters={"config": {"environments": ["a"]}})
    assert "nightly-eval" in {spec.name for spec in specs}
    texts: list[str] = []
    for spec in specs:
        flow = getattr(importlib.import_module(spec.module), spec.function)
        texts += [spec.description, flow.description or ""]
        texts += _strings(flow.parameters.model_dump(mode="json"))
    assert any("NAME@VERSION" in text for text in texts)  # the forms were read
    linked = sorted({m.group(0) for text in texts for m in EMAIL_AUTOLINK.finditer(text)})
    assert not linked, f"these become mailto: links in the V1 run form: {linked}"


def test_sweep_and_nightly_reports_say_what_the_cells_cost_and_which_are_unpriced() -> None:
    def cell(name: str, cost: float | None) -> dict[str, Any]:
        return {
            "env": name, "env_ref": name, "version": "0.1.0", "model_alias": "m",
            "sampling": "s", "run_id": f"run-{name}", "status": "completed",
            "reward_mean": 0.5, "reward_stderr": 0.1, "cost_usd": cost,
        }  # fmt: skip

    priced = [cell("a", 0.25), cell("b", 0.125)]
    assert cost_line(priced) == "$0.3750"
    assert cost_line([*priced, cell("c", None)]) == "$0.3750 (1 of 3 cells unpriced)"
    assert cost_line([cell("c", None)]) == "unpriced"  # never $0
    assert cost_line([{"env": "old", "run_id": "r"}]) is None  # results from before costs
    md = sweep_markdown([*priced, cell("c", None)])
    assert "3 cells. Cost: $0.3750 (1 of 3 cells unpriced)." in md
    assert "cost $0.2500" in md and "cost unpriced" in md
    night = nightly_markdown([], night="2026-11-02", cost=cost_line(priced))
    assert "This night cost $0.3750." in night
