"""Sinks and request middleware by name: entry points.

A package registers a sink factory under ``vfops.eval_sinks`` (``csv =
my_pkg.sinks:CsvSink``) and users choose it by name: ``vfops eval --sink csv``, a sweep
or nightly spec's ``sinks``, ``RunOptions(sinks=...)``. The factory is called with the
run's :class:`RunInfo` once the run is known (before its first group) and returns a
:class:`~vfops.evaluation.Sink`: it then gets every scored group after the run's own
sinks and is closed with the outcome before the run's end is recorded, like any sink.
vfops's own sinks (:data:`BUILT_IN_SINKS`) are entry points of the same group, built the
same way for every run (:func:`vfops.evaluation._default_sinks.open_sinks`). Names are
checked before anything starts (one line listing the installed ones).

Request middleware the same way: a factory under ``vfops.request_middleware`` (called
with no arguments) returns a :class:`~vfops.clients.RequestMiddleware`, chosen with
``vfops eval --middleware NAME`` (``RunOptions(middleware=...)``, a spec's
``middleware``) and installed on the run's client for the run (every request passes
through it: a header, a reservation, a log).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Final

from vfops._errors import InvalidArgumentError
from vfops._rollout import RolloutRecord
from vfops.clients import RequestMiddleware
from vfops.evaluation._sinks import RunFinish, Sink, SinkError, first_line

SINK_GROUP: Final = "vfops.eval_sinks"
BUILT_IN_SINKS: Final = ("arrow", "registry", "mlflow")
"""vfops's own sinks (entry points of :data:`SINK_GROUP`): every run gets them, in this
order, each making its sink only when the run records there."""
MIDDLEWARE_GROUP: Final = "vfops.request_middleware"


@dataclass(frozen=True)
class RunInfo:
    """What a sink is writing for: the run and exactly what ran."""

    run_id: str | None
    """The registry's id (None for a run recorded only in its folder)."""
    run_dir: Path
    env_name: str
    env_version: str | None
    """The published version that ran, or ``local+<hash>``."""
    env_code_hash: str | None
    """The environment's content hash (the same as the registry's)."""
    model: str
    sampling_args: dict[str, Any] = field(default_factory=dict)
    env_args: dict[str, Any] = field(default_factory=dict)
    recording: Any = field(default=None, repr=False, compare=False)
    """How vfops's own sinks reach the run's recorders (registry, tracker, run folder);
    not an API for plug-ins, which need none of it."""


def sink_names() -> list[str]:
    """The installed sinks a run can name (vfops's own are not among them: every run
    has those)."""
    return sorted({ep.name for ep in entry_points(group=SINK_GROUP)} - set(BUILT_IN_SINKS))


def middleware_names() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=MIDDLEWARE_GROUP)})


def check_sink_names(names: Sequence[str], flag: str = "--sink") -> None:
    """Each of ``names`` is an installed sink; else one line naming the installed ones."""
    for name in names:
        if name in BUILT_IN_SINKS:
            raise InvalidArgumentError(
                f"{flag}: {name!r} is one of vfops's own sinks ({', '.join(BUILT_IN_SINKS)}), "
                "which every run has; name only other sinks"
            )
    _check_names(names, sink_names(), "sink", flag, SINK_GROUP)


def check_middleware_names(names: Sequence[str], flag: str = "--middleware") -> None:
    _check_names(names, middleware_names(), "request middleware", flag, MIDDLEWARE_GROUP)


def _check_names(names: Sequence[str], known: list[str], what: str, flag: str, group: str) -> None:
    for name in names:
        if name not in known:
            raise InvalidArgumentError(
                f"{flag}: no {what} named {name!r}; installed: {', '.join(known) or 'none'} "
                f"(a package adds one under the {group} entry point)"
            )


def plugin_middleware(names: Sequence[str]) -> list[RequestMiddleware]:
    """The named request middleware, each made by its factory."""
    found = {ep.name: ep for ep in entry_points(group=MIDDLEWARE_GROUP)}
    made = []
    for name in names:
        middleware = found[name].load()()
        if not isinstance(middleware, RequestMiddleware):
            raise InvalidArgumentError(
                f"request middleware {name!r} ({found[name].value}) has no wrap(send) method"
            )
        made.append(middleware)
    return made


class PluginSink:
    """A named sink, made by ``factory`` with the run's :class:`RunInfo` at its first group."""

    def __init__(
        self,
        name: str,
        factory: Callable[[RunInfo], Any],
        info: Callable[[], Awaitable[RunInfo]],
    ) -> None:
        self.name = f"sink {name}"
        self._factory = factory
        self._info = info
        self._sink: Sink | None = None
        self._lock = asyncio.Lock()

    async def _opened(self) -> Sink:
        async with self._lock:
            if self._sink is None:
                info = await self._info()
                try:
                    sink = self._factory(info)
                except Exception as exc:
                    raise SinkError(
                        self.name, f"could not open ({first_line(exc)})", "fix the sink's package"
                    ) from exc
                if not isinstance(sink, Sink):
                    raise SinkError(
                        self.name, "its factory returned no sink (write_group and close)",
                        "fix the sink's package",
                    )  # fmt: skip
                self._sink = sink
            return self._sink

    async def write_group(self, records: list[RolloutRecord]) -> None:
        await (await self._opened()).write_group(records)

    async def close(self, finish: RunFinish) -> None:
        await (await self._opened()).close(finish)
