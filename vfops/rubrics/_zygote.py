"""The scoring workers' own side (:mod:`vfops.rubrics._workers` is the eval's): the
zygote, forked from the eval or spawned as a fresh interpreter, and the workers it
forks, which run the calls they are sent with a memory limit and end whatever the calls
start. Also what both sides share: the contained objects by id, the frames they
exchange and what a worker answers."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import pickle
import resource
import select
import signal
import socket
import sys
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, Protocol

from vfops._descendants import (
    PR_SET_PDEATHSIG,
    become_subreaper,
    end_descendants,
    prctl,
    reap_any,
)

__all__ = [
    "CONTAINED",
    "FRAME_LENGTH",
    "INLINE",
    "OUT_OF_MEMORY",
    "RAISED",
    "SPAWNED_FD",
    "TIMED_OUT",
    "UNREADABLE",
    "VALUE",
    "Contained",
    "PortableCalls",
    "memory_hint",
    "register_contained",
    "send_frame",
    "spawned_zygote_main",
    "zygote_main",
]

FRAME_LENGTH: Final = 8  # bytes of a frame's length prefix
SPAWNED_FD: Final = 3
"""The spawned zygote's end of its control socket."""

# what a worker answers for one call
VALUE, RAISED, OUT_OF_MEMORY, INLINE, UNREADABLE, TIMED_OUT = 0, 1, 2, 3, 4, 5
"""What a worker answers for one call (the answer's first item)."""


class Contained(Protocol):
    """What a worker can call (:class:`~vfops.rubrics.Rubric`, the adapters' rewards)."""

    def contained_entry(self, index: int) -> tuple[Callable[..., Any], dict[str, Any]]:
        """Function ``index`` and the objects of its own it may take by name (the
        parser): what a call names in ``shared`` comes from there, not from the call."""
        ...

    def contained_size(self) -> int:
        """How many functions it has (a function added after the fork is not in the worker)."""
        ...


class PortableCalls:
    """A contained object as a spawned zygote holds it: its entries, each unpickled from
    what the eval sent (None: it could not be pickled there or loaded here; such a call
    runs in the eval's process)."""

    def __init__(self, entries: list[tuple[Callable[..., Any], dict[str, Any]] | None]) -> None:
        self._entries = entries

    def contained_entry(self, index: int) -> tuple[Callable[..., Any], dict[str, Any]]:
        entry = self._entries[index]
        if entry is None:
            raise _NotHere
        return entry

    def contained_size(self) -> int:
        return len(self._entries)


class _NotHere(Exception):
    """The call's function is not in this worker: run it in the eval's process."""


CONTAINED: weakref.WeakValueDictionary[int, Contained] = weakref.WeakValueDictionary()
_SERIALS = iter(range(1, sys.maxsize))


def register_contained(rubric: Contained) -> int:
    """The rubric's id, by which a worker (a copy of this process) finds its copy. Only
    what is registered before an evaluation starts its workers is in them."""
    serial = next(_SERIALS)
    CONTAINED[serial] = rubric
    return serial


def memory_hint(limit_mb: int) -> str:
    return (
        f"a scoring worker may allocate {limit_mb} MiB (VFOPS_SCORING_MEMORY_MB); raise "
        "VFOPS_SCORING_MEMORY_MB (0: no limit) or make the function use less memory"
    )


# --- processes ---------------------------------------------------------------------------


def _after_fork(parent: int, parent_death: int, inherited: list[Any]) -> None:
    """A forked child's own signals: none of the eval's handlers or its wakeup fd (the
    eval's event loop would read this process's signals as its own); ``inherited``
    (sockets, fds) closed; ``parent_death`` sent to it when its parent dies."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for item in inherited:
        with contextlib.suppress(OSError):
            item.close() if isinstance(item, socket.socket) else os.close(item)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the eval stops its workers
    prctl(PR_SET_PDEATHSIG, parent_death)
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)
    become_subreaper()


def send_frame(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(len(data).to_bytes(FRAME_LENGTH, "little") + data)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> Any:
    head = _recv_exact(sock, FRAME_LENGTH)
    if head is None:
        return None
    body = _recv_exact(sock, int.from_bytes(head, "little"))
    return None if body is None else pickle.loads(body)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    end_descendants()
    os._exit(0)


def _worker_main(sock: socket.socket, limit_mb: int, parent: int, inherited: list[Any]) -> None:
    """Run the calls it is sent until the eval closes its end, or its parent dies."""
    _after_fork(parent, signal.SIGTERM, inherited)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # killed with whatever it started (a timeout kills the group)
    gc.freeze()  # the inherited objects: the collector would copy every page it touches
    if limit_mb > 0:
        _limit_data(limit_mb)
    while True:
        try:
            job = _recv(sock)
        except Exception:  # pickled there, not readable here (a class made at run time)
            send_frame(sock, (UNREADABLE, None))
            continue
        if job is None:
            break
        serial, calls = job
        rubric = CONTAINED.get(serial)
        for index, kwargs, shared in calls:
            start = time.perf_counter()
            kind, payload = _call(rubric, index, kwargs, shared, limit_mb)
            # how long the call kept this worker busy: the eval starts more workers for
            # slow rewards only (its own clock would also count its loop's delays)
            send_frame(sock, (kind, payload, time.perf_counter() - start))
            end_descendants()
    end_descendants()


def _limit_data(limit_mb: int) -> None:
    with open("/proc/self/status") as file:
        status = file.read()
    data_kb = next(int(line.split()[1]) for line in status.splitlines() if "VmData" in line)
    limit = data_kb * 1024 + limit_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _call(
    rubric: Contained | None,
    index: int,
    kwargs: dict[str, Any],
    shared: tuple[str, ...],
    limit_mb: int,
) -> tuple[int, Any]:
    try:
        if rubric is None:
            raise _NotHere
        func, objects = rubric.contained_entry(index)
    except _NotHere:
        return INLINE, None
    kwargs.update({name: objects[name] for name in shared})
    try:
        value = func(**kwargs)
    except MemoryError:
        return OUT_OF_MEMORY, f"ran out of memory: {memory_hint(limit_mb)}"
    except BaseException as exc:  # SystemExit included: the worker goes on
        return RAISED, (type(exc).__name__, str(exc)[:2000])
    if asyncio.iscoroutine(value):
        value.close()
        return INLINE, None  # an async function behind a sync wrapper: runs in the eval
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return VALUE, repr(value)[:200]  # not a number: refused as such by the rubric
    return VALUE, value


def _shed(release: Callable[[], object] | None) -> None:
    """Drop what scoring does not need and return the memory to the kernel: the pages
    freed here leave this process's RSS, and every worker forked from it, instead of
    staying mapped as copies of the eval's."""
    if release is not None:
        with contextlib.suppress(Exception):  # only memory is at stake: go on without
            release()
    gc.collect()  # cycles (a datasets.Dataset's objects) too
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        with contextlib.suppress(Exception):
            arrow.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # free pages inside malloc's heap


def zygote_main(
    control: socket.socket,
    limit_mb: int,
    parent: int,
    inherited: list[Any],
    release: Callable[[], object] | None,
    *,
    first_worker: bool = False,
) -> None:
    """Fork a worker each time the eval asks; end them all when it is gone.
    ``first_worker``: become the first worker asked for instead (see
    :func:`_become_first_worker`)."""
    _after_fork(parent, signal.SIGTERM, inherited)
    _shed(release)
    if first_worker:
        _become_first_worker(control, limit_mb, parent)
        return
    workers: set[int] = set()

    def end_all(*_: Any) -> None:
        for pid in workers:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        end_descendants()
        os._exit(0)

    signal.signal(signal.SIGTERM, end_all)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to be woken up
    gc.freeze()
    zygote = os.getpid()
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            dead = reap_any()
            workers.difference_update(dead)
            if dead:  # a worker's orphans (started with setsid) were handed to this process
                end_descendants(spare=frozenset(workers))
        if control.fileno() in ready:
            if not control.recv(1):
                end_all()
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                try:
                    _worker_main(theirs, limit_mb, zygote, [control, ours, wake_r, wake_w])
                finally:
                    os._exit(0)
            theirs.close()
            workers.add(pid)
            socket.send_fds(control, [pid.to_bytes(FRAME_LENGTH, "little")], [ours.fileno()])
            ours.close()


def _become_first_worker(control: socket.socket, limit_mb: int, parent: int) -> None:
    """Answer the eval's first request for a worker with this process, and serve as that
    worker. A zygote kept beside its workers costs a process whose pages are mostly the
    evaluation's, counted again in its RSS and in each worker's (34 + 33 MB at 100,000
    rollouts of ``arithmetic``), where most evaluations only ever ask for one worker: the
    eval asks a spawned zygote for any other (:class:`~vfops.rubrics._workers.ScoringWorkers`)."""
    if not control.recv(1):
        return  # the eval ended before it needed a worker
    ours, theirs = socket.socketpair()
    socket.send_fds(control, [os.getpid().to_bytes(FRAME_LENGTH, "little")], [ours.fileno()])
    ours.close()
    _worker_main(theirs, limit_mb, parent, [control])


def spawned_zygote_main() -> None:
    """The spawned zygote's start: load what the eval sent, then serve as a forked one."""
    limit_mb, parent = int(sys.argv[1]), int(sys.argv[2])
    control = socket.socket(fileno=SPAWNED_FD)
    message = _recv(control)
    if message is None:
        return
    path, portable = message
    sys.path[:] = path
    held: list[PortableCalls] = []  # CONTAINED holds them weakly
    for serial, entries in portable.items():
        loaded: list[tuple[Callable[..., Any], dict[str, Any]] | None] = []
        for data in entries:
            try:
                loaded.append(None if data is None else pickle.loads(data))
            except BaseException:  # its module does not import here (a
                # test module that skips itself raises a BaseException): that call runs there
                loaded.append(None)
        held.append(PortableCalls(loaded))
        CONTAINED[serial] = held[-1]
    zygote_main(control, limit_mb, parent, [], None)
