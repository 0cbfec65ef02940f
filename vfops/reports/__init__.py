"""Charts (PNG) and markdown for sweep and nightly artifacts; Prefect is not imported here.

matplotlib is imported only when a chart is drawn.
"""

from vfops.reports._charts import (
    PNG_MAGIC,
    cell_label,
    format_sampling,
    nightly_trend_chart,
    png_data_uri,
    sweep_chart,
)
from vfops.reports._markdown import regression_markdown, sweep_markdown

__all__ = [
    "PNG_MAGIC",
    "cell_label",
    "format_sampling",
    "nightly_trend_chart",
    "png_data_uri",
    "regression_markdown",
    "sweep_chart",
    "sweep_markdown",
]
