"""Charts (PNG) and markdown for sweep, nightly, training and promotion artifacts;
Prefect is not imported here.

matplotlib is imported only when a chart is drawn. The markdown is written for the
Prefect UI: text escaped so that ``name@1.2.3`` is never a ``mailto:`` link, charts
inside the report as ``data:`` images, tables with the key columns only.
"""

from vfops.reports._charts import (
    PNG_MAGIC,
    cell_label,
    env_label,
    format_sampling,
    model_label,
    nightly_trend_chart,
    png_data_uri,
    sampling_label,
    sweep_chart,
    training_curve_chart,
)
from vfops.reports._markdown import (
    EMAIL_AUTOLINK,
    RewardCurve,
    cost_line,
    escape_markdown,
    markdown_image,
    nightly_markdown,
    nightly_table,
    regression_markdown,
    sweep_markdown,
    training_markdown,
)
from vfops.reports._progress import training_progress_log
from vfops.reports._promotion import gate_table, loop_markdown, promotion_markdown, report_key

__all__ = [
    "EMAIL_AUTOLINK",
    "PNG_MAGIC",
    "RewardCurve",
    "cell_label",
    "cost_line",
    "env_label",
    "escape_markdown",
    "format_sampling",
    "gate_table",
    "loop_markdown",
    "markdown_image",
    "model_label",
    "nightly_markdown",
    "nightly_table",
    "nightly_trend_chart",
    "png_data_uri",
    "promotion_markdown",
    "regression_markdown",
    "report_key",
    "sampling_label",
    "sweep_chart",
    "sweep_markdown",
    "training_curve_chart",
    "training_markdown",
    "training_progress_log",
]
