"""PNG charts for sweep and nightly artifacts.

Figures are built with :class:`matplotlib.figure.Figure` on an explicit Agg canvas,
never through ``pyplot``: no global backend switch, no figure registry to leak
into, nothing to close. matplotlib is imported inside the functions so importing
this package stays light.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from vfops._errors import InvalidArgumentError

Z_95 = 1.96
"""Error bars show ±1.96 standard errors (a 95 % normal interval)."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for embedding a PNG in markdown."""
    if not png.startswith(PNG_MAGIC):
        raise InvalidArgumentError("not PNG data (missing the PNG signature)")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def format_sampling(sampling: Any) -> str:
    """A short label for a sampling config: ``t=0.7, top_p=0.9`` or the value as text."""
    if sampling is None:
        return "default"
    if isinstance(sampling, Mapping):
        short = {"temperature": "t", "max_tokens": "max_tok"}
        parts = [f"{short.get(str(k), str(k))}={v}" for k, v in sampling.items()]
        return ", ".join(parts) if parts else "default"
    return str(sampling)


def env_label(cell: Mapping[str, Any]) -> str:
    """``NAME@VERSION`` of a cell (a sweep cell's ``env`` and ``version``), else what it has."""
    env = cell.get("env")
    version = cell.get("version")
    if env and version and "@" not in str(env):
        return f"{env}@{version}"
    return str(env or cell.get("env_ref") or cell.get("cell") or "?")


def model_label(cell: Mapping[str, Any]) -> str:
    """The model as the sweep named it: the endpoint alias (``model_alias``) when the cell
    has one, else ``model``; the same word in the table, the report and the chart."""
    return str(cell.get("model_alias") or cell.get("model") or "?")


def sampling_label(cell: Mapping[str, Any]) -> str:
    """A sampling config's name with its arguments (``cold (t=0.0)``), or its arguments."""
    sampling = cell.get("sampling")
    args = cell.get("sampling_args")
    if isinstance(sampling, str) and isinstance(args, Mapping) and args:
        return f"{sampling} ({format_sampling(args)})"
    return format_sampling(sampling)


def cell_label(cell: Mapping[str, Any], *, sep: str = "\n") -> str:
    """``env@version / model / sampling`` of one sweep cell (``sep`` between the parts)."""
    return sep.join([env_label(cell), model_label(cell), sampling_label(cell)])


def _new_figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _legend(fig: Any, ax: Any, *, handles: Any = None, title: str | None = None) -> None:
    """The legend below the axes, at a fixed place: matplotlib's default ("best") searches
    the axes for a free corner and warns when that is slow, which it was on a loaded
    machine (warnings are errors in the tests). Below, not beside: beside the axes, at the
    top right, a long series name ("lucky_digit · models:/NAME@champion") squeezed the
    axes narrower than their title, and the legend covered the title's end."""
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    labels = [handle.get_label() for handle in handles]
    columns = max(1, min(len(labels), 3, 60 // max(len(label) for label in labels)))
    fig.legend(handles, labels, loc="outside lower center", ncols=columns, title=title, fontsize=8)


def _to_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    fig.clear()
    return buf.getvalue()


def _float(value: Any) -> float:
    return float(value) if value is not None else float("nan")


def sweep_chart(cells: Sequence[Mapping[str, Any]], *, title: str = "Reward per cell") -> bytes:
    """PNG bar chart: mean reward of each sweep cell with ±1.96 stderr error bars.

    ``cells``: mappings with ``env``, ``model``, ``sampling``, ``reward_mean`` and
    ``reward_stderr`` (a missing stderr draws no bar). Bars are coloured by model.
    """
    if not cells:
        raise InvalidArgumentError("sweep_chart needs at least one cell")
    labels = [cell_label(c) for c in cells]
    means = [_float(c.get("reward_mean")) for c in cells]
    errors = [
        Z_95 * (_float(c.get("reward_stderr")) if c.get("reward_stderr") else 0.0) for c in cells
    ]
    models = list(dict.fromkeys(model_label(c) for c in cells))
    fig = _new_figure(max(6.0, 0.9 * len(cells) + 2.0), 4.8)
    ax = fig.add_subplot()
    palette = [f"C{i % 10}" for i in range(len(models))]
    colours = [palette[models.index(model_label(c))] for c in cells]
    positions = list(range(len(cells)))
    ax.bar(
        positions, means, yerr=errors, capsize=4, color=colours, edgecolor="black", linewidth=0.5
    )
    for x, mean, err in zip(positions, means, errors, strict=True):
        if mean == mean:  # not NaN
            ax.annotate(
                f"{mean:.3f}",
                (x, mean + err),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=8,
            )
    ax.set_xticks(
        positions,
        labels,
        fontsize=7,
        rotation=30 if len(cells) > 6 else 0,
        ha="right" if len(cells) > 6 else "center",
    )
    ax.set_ylabel("reward (mean ± 1.96 stderr)")
    ax.set_title(title)
    top = max((m + e for m, e in zip(means, errors, strict=True) if m == m), default=1.0)
    ax.set_ylim(min(0.0, min((m for m in means if m == m), default=0.0)), max(1.05, top * 1.1))
    ax.grid(axis="y", alpha=0.3)
    if len(models) > 1:
        from matplotlib.patches import Patch

        patches = [Patch(color=palette[i], label=m) for i, m in enumerate(models)]
        _legend(fig, ax, handles=patches, title="model")
    return _to_png(fig)


def _x_label(value: date | datetime | str) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def nightly_trend_chart(
    history: Mapping[str, Sequence[tuple[date | datetime | str, float, float | None]]],
    *,
    title: str = "Nightly reward per environment",
) -> bytes:
    """PNG line chart: one line per environment over nightly runs, ±1.96 stderr bars.

    ``history``: ``env -> [(night, reward_mean, reward_stderr), ...]``, the night being the
    date the nightly run was scheduled for (not when it started: a night that runs late or
    is re-run stays on its own date). Runs of all environments share one date axis (ISO
    dates sort in time order).
    """
    if not history or not any(history.values()):
        raise InvalidArgumentError("nightly_trend_chart needs at least one point")
    ticks = sorted({_x_label(point[0]) for points in history.values() for point in points})
    index = {label: i for i, label in enumerate(ticks)}
    # each series beyond two gets a legend row's height below the axes
    fig = _new_figure(max(6.0, 0.6 * len(ticks) + 3.0), 4.8 + 0.2 * max(0, len(history) - 2))
    ax = fig.add_subplot()
    for env, points in history.items():
        ordered = sorted(points, key=lambda p: index[_x_label(p[0])])
        xs = [index[_x_label(p[0])] for p in ordered]
        ys = [_float(p[1]) for p in ordered]
        errs = [Z_95 * (_float(p[2]) if p[2] else 0.0) for p in ordered]
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=env)
    ax.set_xticks(range(len(ticks)), ticks, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("reward (mean ± 1.96 stderr)")
    ax.set_xlabel("night")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(fig, ax, title="environment · model")
    return _to_png(fig)


def training_curve_chart(
    train: Sequence[tuple[int, float]],
    held_out: Sequence[tuple[int, float]] = (),
    *,
    title: str = "Reward per step",
) -> bytes:
    """PNG line chart of a training run: train reward per step and held-out reward per
    step where it was measured (the baseline eval is step 0).

    ``train`` and ``held_out``: ``[(step, reward), ...]`` in any order.
    """
    if not train and not held_out:
        raise InvalidArgumentError("training_curve_chart needs at least one point")
    fig = _new_figure(7.0, 4.2)
    ax = fig.add_subplot()
    if train:
        steps, rewards = zip(*sorted(train), strict=True)
        ax.plot(steps, rewards, marker="." if len(train) < 60 else None, label="train (batch mean)")
    if held_out:
        steps, rewards = zip(*sorted(held_out), strict=True)
        ax.plot(steps, rewards, marker="o", linestyle="--", label="held-out eval")
        for step, reward in (sorted(held_out)[0], sorted(held_out)[-1]):
            ax.annotate(
                f"{reward:.3f}",
                (step, reward),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(fig, ax)
    return _to_png(fig)
