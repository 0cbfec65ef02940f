"""The synchronous twin of a coroutine function, with the same typed signature (written once)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


def blocking_twin(fn: Callable[_P, Coroutine[Any, Any, _T]]) -> Callable[_P, _T]:
    """The synchronous twin of the coroutine function ``fn`` (runs its own event loop)."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        return asyncio.run(fn(*args, **kwargs))

    return run
