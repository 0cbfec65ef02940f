"""vfops.reports: PNG charts and markdown for sweep and nightly artifacts."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from datetime import date, datetime
from typing import Any

import numpy as np
import pytest

from vfops.reports import (
    PNG_MAGIC,
    nightly_trend_chart,
    png_data_uri,
    regression_markdown,
    sweep_chart,
    sweep_markdown,
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
    assert "gsm8k@1.2.0" in md and "t=0.7" in md
    assert "| 0.620 | [0.561, 0.679] |" in md  # mean, ±1.96 stderr
    assert "12,345" in md and "errors" in md
    assert f"![reward per cell]({png_data_uri(png)})" in md
    assert "![" not in sweep_markdown(cells())


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
    assert f"±{regressed.noise_floor.value:.3f} (split-half)" in rows[0]
    assert "measured from the previous run's own rollouts, not assumed" in md
    assert md.count("measured by split-half resampling of the baseline") == 2
    assert "data:image/png;base64," in md

    assert "No regressions in 1 cell." in regression_markdown([("x", steady)])
