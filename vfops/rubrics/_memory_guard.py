"""A memory limit on this process while reward functions score in it.

The scoring workers (:mod:`vfops.rubrics._workers`) contain the sync reward functions
they can take. The rest score in the eval's own process: async functions (they share
its event loop, its clients and its cost accounting: a judge), sync ones when there are
no workers, and a ``verifiers`` rubric's async functions. While any of those runs, this
process's soft ``RLIMIT_DATA`` is what it had written when scoring began plus the same
allowance a worker gets (``VFOPS_SCORING_MEMORY_MB``): a reward function that allocates
past it raises ``MemoryError`` in its own frame (its rollout's ``ScoringMemoryLimit``
error, and the frame's memory is freed as it unwinds) instead of getting the whole
eval OOM-killed. Outside scoring there is no limit, so loading a model or a dataset in
this process is never refused by it.

What it cannot tell apart: anything else this process allocates past the allowance while
a reward function scores (another thread's work) fails the same way; the allowance is
a worker's, half the machine's memory shared among the workers by default, so only a
blow-up reaches it. The hard limit is never touched: a child may set its own.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections.abc import Iterator
from typing import Final

from vfops._rollout import RolloutError
from vfops.rubrics._workers import scoring_memory_mb, scoring_workers

__all__ = ["memory_error", "scoring_in_process"]

_PAGE: Final = os.sysconf("SC_PAGE_SIZE")


class _Guard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._restore: int | None = None
        self.allowance_mb = 0

    def arm(self) -> None:
        with self._lock:
            self._active += 1
            if self._active > 1:
                return
            limit = self._measured()
            if limit is None:
                return
            soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
            if hard != resource.RLIM_INFINITY and limit > hard:
                return  # a stricter limit holds already
            if soft != resource.RLIM_INFINITY and soft <= limit:
                return
            resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
            self._restore = soft

    def disarm(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active or self._restore is None:
                return
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            resource.setrlimit(resource.RLIMIT_DATA, (self._restore, hard))
            self._restore = None

    def _measured(self) -> int | None:
        # measured at every first holder: a base kept from earlier could sit below what
        # the process has written since (a model loaded between two scorings), and a
        # limit under that would refuse every allocation
        self.allowance_mb = scoring_memory_mb(max(1, scoring_workers()))
        if not self.allowance_mb:
            return None  # VFOPS_SCORING_MEMORY_MB=0, or the machine's memory is unknown
        return _data_bytes() + (self.allowance_mb << 20)


def _data_bytes() -> int:
    """The private writable memory ``RLIMIT_DATA`` counts (``statm``'s data field: the
    data segment and the stack, a few microseconds to read)."""
    with open("/proc/self/statm") as file:
        return int(file.read().split()[5]) * _PAGE


_GUARD: Final = _Guard()


@contextlib.contextmanager
def scoring_in_process() -> Iterator[None]:
    """Hold this process's memory limit while reward functions score in it (nested and
    concurrent holders share one limit; the last to leave lifts it)."""
    _GUARD.arm()
    try:
        yield
    finally:
        _GUARD.disarm()


def memory_error(name: str) -> RolloutError:
    """A reward function's ``MemoryError`` in this process, as its rollout's error."""
    allowance = _GUARD.allowance_mb
    limit = f"{allowance} MiB beyond the eval's own memory" if allowance else "no set limit"
    message = (
        f"reward function {name!r} ran out of memory ({limit}, VFOPS_SCORING_MEMORY_MB); "
        "make it use less memory or raise VFOPS_SCORING_MEMORY_MB (0: no limit)"
    )
    return RolloutError(type="ScoringMemoryLimit", message=message, stage="scoring")
