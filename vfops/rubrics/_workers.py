"""Scoring workers: sync reward functions run in processes with a memory limit, and
whatever they start ends with them.

A reward function is user code. Run in the eval's own process, one that allocates
10 GB gets the whole eval OOM-killed (no message, the run left ``running``, nothing
recorded) and a subprocess it starts outlives the eval. So during an evaluation the
sync reward functions of the rubrics that exist when it starts run in **scoring
workers**:

- A *zygote* is forked from the eval process once, after its input and endpoint are
  checked (a refusal forks nothing) and before the tracker or the registry start
  threads, where no other thread runs, so it holds the loaded environment, rubric and
  reward functions. Where other threads run (a flow's engine, a sweep's concurrent
  cells, a notebook) a fork would copy locks they may hold, and its child could hang
  on one: the zygote is then **spawned** (``posix_spawn`` of a fresh interpreter) and
  sent this process's ``sys.path`` and each function with its own objects (the parser),
  pickled by ``cloudpickle``: a module's function travels by name and the zygote
  imports its module, a lambda or a closure by value; a function bound to something
  that cannot be pickled (a client) stays in the eval's process. Its RSS is its own
  (the interpreter, vfops's rubrics and the environments' modules), shared with the
  workers it forks. A forked zygote's first act is to drop what scoring does not need
  (the environment's built rows, through the ``release`` the eval passes) and give
  that memory back to the kernel (``gc``, Arrow's pool, ``malloc_trim``): a forked
  process's RSS counts every page it
  inherited, so without this the zygote and each worker would show the whole dataset
  again (48-50 MB each at 100,000 rollouts of ``arithmetic``; ~25 MB now, the
  interpreter and the modules loaded by then). It is forked before the eval builds
  its rows, so a split built lazily is never built in it; the formatted rows of one
  built earlier are dropped (a list the environment was given stays: it holds it;
  a reward that reads the environment's dataset builds it again). A forked zygote
  **becomes the first worker** when a call first needs one: a zygote kept beside its
  worker was a second process whose pages are mostly the eval's, counted in full in the
  RSS of each (34 + 33 MB at 100,000 rollouts of ``arithmetic``; the tree's RSS sum 316
  MB, 287 MB without it), where most evaluations (cheap rewards) only ever use one
  worker. Any other worker (slow rewards, or a fresh one for each that dies or is
  killed) comes from a zygote spawned the first time one is needed, sent the functions
  as where threads run (below); a spawned zygote stays a zygote and forks them. So no
  worker is forked from a process with threads running.
- A worker runs the sync calls of one group (the same calls, in the same order, the
  scoring threads of :mod:`vfops.rubrics._limits` run otherwise): it receives the
  rubric's id, each function's index and its arguments (prompt, completion, answer,
  state...: pickled; ``parser`` is its own copy) and sends back each call's value or
  error. Its data segment may grow ``VFOPS_SCORING_MEMORY_MB`` beyond what it shares
  with the environment (``RLIMIT_DATA``: counted on the memory a process writes, not on
  reserved address space or thread stacks): an allocation past that raises
  ``MemoryError`` in the reward function, recorded as that rollout's
  ``ScoringMemoryLimit`` error (never scored) naming the limit and how to raise it; the
  eval and the other rollouts go on. A worker that dies anyway (a C extension that
  aborts) errors the call it was running and is replaced; a call past the scoring
  timeout kills its worker (a thread can only be abandoned).
- Children: a worker is a child subreaper and its own process group. After every call
  it ends every process the call left behind (its children, and their orphans, which
  the kernel hands to the worker); a worker killed with its calls kills its process
  group, and the zygote (a subreaper too) ends any orphan handed to it. When the eval
  ends, or dies (``PR_SET_PDEATHSIG``), the zygote ends every worker and every process
  below it; the first worker, the eval's own child, ends what is below it itself.

Not contained (they run in the eval's process, as before): async reward functions (a
judge's client is bound to the eval's event loop), sync functions that take the
rubric's own extra objects (``judge``), rubrics or functions made after the eval
started, and calls whose arguments cannot be pickled. A reward function's writes to
``state`` stay in its worker (later functions of the same group see them). Adapted
libraries use the same workers through :func:`register_contained` and
:func:`run_contained`: ``verifiers``' classic rubrics
(:mod:`vfops.adapters._verifiers_scoring`) and v1 tasks' rewards and metrics, async
ones included (:mod:`vfops.adapters._v1_scoring`). ``VFOPS_SCORING_WORKERS=0`` scores
in-process, in threads, as before. A ``tqdm`` monitor thread (``datasets`` starts one
when it formats rows) is ended before the fork: it would otherwise keep scoring
in-process.
Linux only (elsewhere: in-process).

Settings (read when an evaluation starts):

- ``VFOPS_SCORING_WORKERS`` (default ``min(4, CPUs)``; 0: no workers): the most
  processes that run sync reward functions at the same time, each ~25-35 MB of RSS
  whatever the run's size (the second brings a spawned zygote with it). They start as
  needed: the first with the first call, another
  when a call finds them all busy and one call (not a worker's first, which pays its
  warm-up) has kept its worker busy for ``_SLOW_CALL_S`` (the worker's own clock), or a
  call has waited ``_GROW_AFTER_S``.
  Cheap rewards (well under a millisecond) keep one worker; slow ones get the
  parallelism (a worker answers one group at a time).
- ``VFOPS_SCORING_MEMORY_MB`` (default: half of the machine's memory, or of its cgroup's
  limit, shared among the workers; 0: no limit): how much memory each worker's reward
  functions may allocate.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import signal
import socket
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from vfops._errors import InvalidArgumentError
from vfops._rollout import RolloutError
from vfops.rubrics._limits import SyncOutcome
from vfops.rubrics._zygote import (
    CONTAINED,
    FRAME_LENGTH,
    INLINE,
    OUT_OF_MEMORY,
    RAISED,
    SPAWNED_FD,
    TIMED_OUT,
    UNREADABLE,
    VALUE,
    Contained,
    memory_hint,
    register_contained,
    send_frame,
    zygote_main,
)

__all__ = [
    "Contained",
    "ContainedCall",
    "ScoringWorkers",
    "WorkerFailure",
    "register_contained",
    "run_contained",
    "start_scoring_workers",
]

ContainedCall = tuple[int, dict[str, Any], tuple[str, ...]]
"""One sync call sent to a worker: the function's index in its rubric, the arguments
that travel (pickled) and the names of the rubric's own objects it also takes."""

_MAX_DEFAULT_WORKERS: Final = 4

_SLOW_CALL_S: Final = 0.02
"""A call that keeps its worker busy this long makes the pool grow as calls wait (wall
time in the worker: a reward waiting on I/O counts; well above what a cheap call shows
when a loaded machine deschedules its worker for a slice)."""
_GROW_AFTER_S: Final = 5.0
"""How long a call waits before another worker is started anyway (a slow reward's first
answer may be far off). Not shorter: behind one worker the calls of a large eval queue
for the eval's own loop to read their answers, and a short wait would read that queue as
a busy worker."""
_CONTAINMENT_FAILURES: Final = frozenset({"ScoringMemoryLimit", "ScoringWorkerDied"})

_ACTIVE: list[ScoringWorkers] = []


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def pool_for(serial: int, rubric: Contained) -> ScoringWorkers | None:
    """The running workers that hold this rubric as it is now, if any (the newest)."""
    loop = _running_loop()
    for pool in reversed(_ACTIVE):
        # its streams belong to the loop of the evaluation that started it
        if pool.loop is loop and pool.covered.get(serial) == rubric.contained_size():
            return pool
    return None


# --- settings ----------------------------------------------------------------------------


def _int_setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"{name} must be a whole number >= 0, not {raw!r}")
    return value


@functools.cache
def _machine_memory() -> int | None:
    """Bytes of memory this process can have: the machine's, or its cgroup's limit (read
    once: every scoring in this process asks)."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError), open(path) as file:
            found.append(int(file.read().strip()))  # "max": no limit (ValueError)
    return min(found) if found else None


def scoring_workers() -> int:
    """``VFOPS_SCORING_WORKERS``, else ``min(4, CPUs)``."""
    return _int_setting("VFOPS_SCORING_WORKERS", min(_MAX_DEFAULT_WORKERS, os.cpu_count() or 1))


def scoring_memory_mb(workers: int) -> int:
    """``VFOPS_SCORING_MEMORY_MB``, else half of the memory shared among ``workers``."""
    memory = _machine_memory()
    default = 0 if memory is None else max(256, memory // 2 // max(1, workers) >> 20)
    return _int_setting("VFOPS_SCORING_MEMORY_MB", default)


# --- the errors a worker reports -----------------------------------------------------------


class WorkerFailure(Exception):
    """A contained call's failure, as the rollout's error (the function's name added)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail

    @property
    def contained(self) -> bool:
        """Whether containment stopped the call (memory limit, worker died), rather than
        the function raising."""
        return self.kind in _CONTAINMENT_FAILURES

    def rollout_error(self, name: str) -> RolloutError:
        if self.contained:
            message = f"reward function {name!r} {self.detail}"
        else:  # the function raised: as in-process
            message = f"reward function {name!r} raised {self.kind}: {self.detail}"
        return RolloutError(type=self.kind, message=message[:2000], stage="scoring")


# --- the eval's side ---------------------------------------------------------------------


class _Worker:
    __slots__ = ("answered", "pid", "reader", "writer")

    def __init__(self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.pid, self.reader, self.writer = pid, reader, writer
        self.answered = 0  # calls answered: a worker's first pays its warm-up

    async def recv(self) -> Any:
        try:
            head = await self.reader.readexactly(FRAME_LENGTH)
            body = await self.reader.readexactly(int.from_bytes(head, "little"))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return pickle.loads(body)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)  # not yet its own group
        self.writer.close()


class ScoringWorkers:
    """The zygote and its workers of one evaluation (see the module docstring).

    ``first_becomes_worker``: the zygote answers the first request for a worker with
    itself (a forked zygote: :func:`~vfops.rubrics._zygote.zygote_main`); any other worker
    comes from a zygote spawned when it is first needed."""

    def __init__(
        self,
        zygote: int,
        control: socket.socket,
        covered: dict[int, int],
        size: int,
        limit_mb: int,
        *,
        first_becomes_worker: bool = False,
    ) -> None:
        self.zygote, self.size, self.limit_mb = zygote, size, limit_mb
        self.covered = covered
        """The rubrics the zygote holds: id -> how many functions each had."""
        self._control = control
        self._turns = first_becomes_worker
        self._turned = False  # the first zygote was asked for its worker
        self._more: tuple[int, socket.socket] | None = None  # the spawned zygote, once needed
        self._spawn_lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._count = 0
        self._slow = False  # a call kept its worker busy for _SLOW_CALL_S or more
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop of the evaluation that started it (its streams are that loop's)."""

    async def run(
        self, serial: int, calls: list[ContainedCall], limit_s: float | None
    ) -> list[tuple[int, Any]] | None:
        """Each call's answer, in order, or a time-out for one past
        ``limit_s``; None when the calls cannot be sent (run them in-process)."""
        answers: list[tuple[int, Any]] = []
        while len(answers) < len(calls):
            rest = calls[len(answers) :]
            try:
                job = pickle.dumps((serial, rest), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                if answers:  # the first part was sent whole: the rest fails the same way
                    raise
                return None
            worker = await self._acquire()
            if worker is None:
                return None if not answers else [*answers, *self._gone(len(rest))]
            healthy = False
            try:
                worker.writer.write(len(job).to_bytes(FRAME_LENGTH, "little") + job)
                for _ in rest:
                    try:
                        async with asyncio.timeout(limit_s):
                            answer = await worker.recv()
                    except TimeoutError:
                        answers.append((TIMED_OUT, None))
                        break
                    if answer is None:
                        answers.append((RAISED, ("ScoringWorkerDied", self._died())))
                        break
                    if len(answer) == 3:  # a call's answer: (kind, payload, busy seconds)
                        # not a worker's first call: it pays the function's warm-up
                        # (imports, compiled patterns), which says nothing of its cost
                        warm = worker.answered > 0
                        self._slow = self._slow or (warm and answer[2] >= _SLOW_CALL_S)
                        worker.answered += 1
                        answer = answer[:2]
                    if answer[0] == UNREADABLE:  # in-process, all of them
                        if not answers:
                            healthy = True
                            return None
                        answers.extend([(INLINE, None)] * len(rest))
                        break
                    answers.append(answer)
                else:
                    healthy = True
            finally:
                self._release(worker, healthy)
        return answers

    def _died(self) -> str:
        return (
            "ended its scoring worker (it crashed or was killed: a C extension that "
            f"cannot allocate memory aborts); if it ran out of memory, {memory_hint(self.limit_mb)}"
        )

    @staticmethod
    def _gone(count: int) -> list[tuple[int, Any]]:
        detail = ("ScoringWorkerDied", "could not run: the scoring workers are gone")
        return [(RAISED, detail)] * count

    async def _acquire(self) -> _Worker | None:
        loop = asyncio.get_running_loop()
        grow_at: float | None = None  # when a call still waiting may start another worker
        while not self._idle and not self._closed:
            can_grow = self._count < self.size
            waited = grow_at is not None and loop.time() >= grow_at
            if can_grow and (self._count == 0 or self._slow or waited):
                break
            if can_grow and grow_at is None:
                # a worker answers a cheap reward in well under a millisecond: another
                # process (~25 MB) once a call kept one busy for _SLOW_CALL_S, or a call
                # has waited this long (the first answer of a slow reward may be far off)
                grow_at = loop.time() + _GROW_AFTER_S
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiting.append(waiter)
            try:
                async with asyncio.timeout_at(grow_at if can_grow else None):
                    await waiter
            except TimeoutError:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken as the wait ran out: the turn passes on
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # its turn passes on
                raise
        if self._closed:
            return None
        if self._idle:
            return self._idle.pop()
        self._count += 1
        try:
            pid, fd = await asyncio.to_thread(self._spawn)
            reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd))
        except (OSError, ValueError):
            self._count -= 1
            self._wake()
            if self._count > 0:  # no other worker can be made: the calls wait for these
                self.size = self._count
                return await self._acquire()
            return None  # no worker and no zygote: in-process from now on
        return _Worker(pid, reader, writer)

    def _spawn(self) -> tuple[int, int]:
        with self._spawn_lock:
            if self._turned:
                control = self._more_control()
            else:
                control, self._turned = self._control, self._turns
            control.sendall(b"F")
            message, fds, _, _ = socket.recv_fds(control, FRAME_LENGTH, 1)
        if not message or not fds:
            raise OSError("the scoring zygote is gone")
        return int.from_bytes(message, "little"), fds[0]

    def _more_control(self) -> socket.socket:
        """The control socket of the zygote that makes the workers after the first,
        spawned the first time one is needed: sent the functions by ``cloudpickle``, as
        where threads run (those that cannot travel score in the eval's process)."""
        if self._more is None:
            spawned = _spawn_zygote(self.limit_mb)
            if spawned is None:
                raise OSError("no reward function of this evaluation can be sent to a zygote")
            self._more = spawned
        return self._more[1]

    def _release(self, worker: _Worker, healthy: bool) -> None:
        if healthy and not self._closed:
            self._idle.append(worker)
        else:
            worker.kill()
            self._count -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """End the workers, every process below them, and the zygote."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError):
            _ACTIVE.remove(self)
        for worker in self._idle:
            worker.writer.close()
        self._idle.clear()
        while self._waiting:
            self._wake()
        self._control.close()  # the zygote ends every worker and what they started
        more, self._more = self._more, None
        if more is not None:
            more[1].close()
        await asyncio.to_thread(_reap_zygote, self.zygote)
        if more is not None:
            await asyncio.to_thread(_reap_zygote, more[0])


def _reap_zygote(pid: int, wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
            time.sleep(0.005)
            continue
        return  # not ours to reap (already reaped)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)  # its handler ends the workers and theirs
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _stop_progress_monitor() -> None:
    """End ``tqdm``'s monitor threads, if progress bars started one (``datasets`` does
    when it formats rows): they only adjust bars that stall, and a running thread keeps
    the workers from being forked. None is started after (``monitor_interval = 0``)."""
    monitors = sys.modules.get("tqdm._monitor")
    if monitors is None:
        return
    for thread in threading.enumerate():
        if isinstance(thread, monitors.TMonitor):
            bar = thread.tqdm_cls
            bar.monitor_interval = 0
            with contextlib.suppress(Exception):
                thread.exit()  # sets its event and joins it
            bar.monitor = None


def start_scoring_workers(
    release: Callable[[], object] | None = None, *, allow_threads: bool = False
) -> ScoringWorkers | None:
    """Start the zygote of the rubrics that exist now; None when scoring stays
    in-process (``VFOPS_SCORING_WORKERS=0``, not Linux, no rubric). Where no other thread
    runs the zygote is forked, holding them as they are; ``release`` is called in it,
    first: it drops what the eval holds and scoring does not need (the environment's
    rows), so the zygote and its workers do not hold a copy of it. Where other threads
    run (a flow's engine, a sweep's other cells, a notebook), a fork would copy locks
    they may hold and its child could hang on one: the zygote is then a fresh
    interpreter (spawned) that is sent each function and its objects, pickled (see
    :func:`_spawn_zygote`). ``allow_threads``: fork even though other threads run, for a
    caller that knows none of them holds a lock the zygote needs."""
    if not sys.platform.startswith("linux") or not CONTAINED:
        return None
    _stop_progress_monitor()
    size = scoring_workers()
    if size == 0:
        return None
    limit_mb = scoring_memory_mb(size)
    covered = {serial: rubric.contained_size() for serial, rubric in list(CONTAINED.items())}
    if threading.active_count() > 1 and not allow_threads:
        spawned = _spawn_zygote(limit_mb)
        if spawned is None:
            return None
        pid, ours = spawned
        pool = ScoringWorkers(pid, ours, covered, size, limit_mb)
    else:
        pid, ours = _fork_zygote(limit_mb, release)
        pool = ScoringWorkers(pid, ours, covered, size, limit_mb, first_becomes_worker=True)
    pool.loop = _running_loop()
    _ACTIVE.append(pool)
    return pool


def _fork_zygote(limit_mb: int, release: Callable[[], object] | None) -> tuple[int, socket.socket]:
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    with warnings.catch_warnings():
        # Python 3.12 warns of a fork with threads running (allow_threads): the zygote
        # runs only this module's loop and forks workers from itself, never from the eval
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            zygote_main(theirs, limit_mb, parent, [ours], release, first_worker=True)
        finally:
            os._exit(0)
    theirs.close()
    return pid, ours


_MAX_ENTRY_BYTES: Final = 64 << 20  # a function bound to something larger runs here


def _portable_entries() -> dict[int, list[bytes | None]]:
    """Each contained object's entries, pickled by ``cloudpickle`` (a module's function
    by name, a lambda or a closure by value, as a verifiers parser holds one; None: this
    one cannot be, an object bound to this process such as a client, or it is larger
    than ``_MAX_ENTRY_BYTES``)."""
    import cloudpickle  # only here: a fork needs none

    portable: dict[int, list[bytes | None]] = {}
    for serial, rubric in list(CONTAINED.items()):
        entries: list[bytes | None] = []
        for index in range(rubric.contained_size()):
            try:
                data = cloudpickle.dumps(rubric.contained_entry(index), pickle.HIGHEST_PROTOCOL)
            except Exception:
                entries.append(None)
                continue
            entries.append(data if len(data) <= _MAX_ENTRY_BYTES else None)
        if any(entry is not None for entry in entries):
            portable[serial] = entries
    return portable


def _spawn_zygote(limit_mb: int) -> tuple[int, socket.socket] | None:
    """A zygote started as a fresh interpreter (``posix_spawn``: safe with threads
    running), sent this process's ``sys.path`` and the contained functions by value (a
    module's function by name: the zygote imports its module). None when no function can
    travel so (every call then runs in-process)."""
    portable = _portable_entries()
    if not portable:
        return None
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    code = "from vfops.rubrics._zygote import spawned_zygote_main; spawned_zygote_main()"
    argv = [sys.executable, "-c", code, str(limit_mb), str(parent)]
    if theirs.fileno() == SPAWNED_FD:
        os.set_inheritable(SPAWNED_FD, True)
        actions: list[tuple[Any, ...]] = []
    else:
        actions = [(os.POSIX_SPAWN_DUP2, theirs.fileno(), SPAWNED_FD)]
    try:
        pid = os.posix_spawn(sys.executable, argv, dict(os.environ), file_actions=actions)
    except OSError:
        ours.close()
        theirs.close()
        return None
    theirs.close()
    # small (functions by reference): it fits the socket's buffer; a larger one waits
    # for the zygote to read it
    send_frame(ours, (list(sys.path), portable))
    return pid, ours


async def run_contained(
    serial: int, rubric: Contained, calls: list[ContainedCall], limit_s: float | None
) -> list[SyncOutcome | None] | None:
    """Each call's outcome from a scoring worker of this evaluation that holds ``rubric``
    as it is now (an error: a :class:`WorkerFailure`), None for a call to run in this
    process after all (a sync wrapper of an async function); None for all of them when
    no worker can take them (no workers, a rubric changed since they started, arguments
    that cannot be pickled)."""
    pool = pool_for(serial, rubric)
    if pool is None:
        return None
    answers = await pool.run(serial, calls, limit_s)
    if answers is None:
        return None
    outcomes: list[SyncOutcome | None] = []
    for answer in answers:
        value, error, timed_out, here = answer_outcome(answer)
        outcome = SyncOutcome(value=value, error=error, timed_out=timed_out)
        outcomes.append(None if here else outcome)
    return outcomes


def answer_outcome(answer: tuple[int, Any]) -> tuple[Any, BaseException | None, bool, bool]:
    """A worker's answer as (value, error, timed out, to run in-process)."""
    kind, payload = answer
    if kind == TIMED_OUT:
        return None, None, True, False
    if kind == VALUE:
        return payload, None, False, False
    if kind == INLINE:
        return None, None, False, True
    if kind == OUT_OF_MEMORY:
        return None, WorkerFailure("ScoringMemoryLimit", payload), False, False
    type_name, detail = payload
    return None, WorkerFailure(type_name, detail), False, False
