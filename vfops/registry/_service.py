"""The registry service: an evaluation's registry work, by operation name, in a worker
thread or another process.

Every registry read and write of an evaluation (opening the run, the batched rollout
inserts, the lease renewals, recording the end, linking MLflow, the cost ledger and
shared pushbacks) is a named operation of :data:`vfops.registry._run_ops.OPERATIONS`,
called through a :class:`RegistryService`: ``await service.call("run.insert", ...)``
runs that operation with the registry's engine. :class:`vfops.registry.RunStore` gives
the run's operations typed names; nothing outside :mod:`vfops.registry` names a
registry function, an engine or a database error.

* :class:`ThreadService` runs the operation in a worker thread of this process, on an
  engine the caller already has (sweeps, promotion, tests that pass ``engine=``).
* :class:`ProcessService` runs it in another process that opens the default registry
  itself (``vfops eval``): the evaluating process never imports SQLAlchemy, and its GIL
  stays with the event loop. On a 2-core machine the registry's import alone (~0.5 s of
  CPU) and each batch's row building otherwise took turns with the rollouts; there they
  run on the other core. A tracked evaluation on the default registry (``vfops eval``'s)
  has them served by a thread of its tracker process (:data:`SERVICE`, the tracker's
  side service: :meth:`ProcessService.over`), which loads SQLAlchemy for MLflow's store
  anyway: one recorder process, not two (~45 MB less for the run's process tree); an
  untracked one starts a registry child (:meth:`ProcessService.start`). Only an
  operation's name and its plain arguments cross the pipe, never a function: the other
  process runs only what :data:`OPERATIONS` names.

Either way a connection failure is raised as :class:`RegistryUnavailable` (the caller
retries it; it names the registry, its URL's password masked, and the reason in a few
words, never the driver's whole message), anything else as the error the operation
raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from vfops._errors import VfopsError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.tracking import SideChannel

_HEADER: Final = struct.Struct(">I")  # each frame: its length, then a pickle
_PROTOCOL: Final = pickle.HIGHEST_PROTOCOL

SERVICE: Final = "vfops.registry._service:serve"
""":func:`serve` as the tracker process's side service (a tracked evaluation on the
default registry starts it so)."""


class RegistryUnavailable(VfopsError):
    """The registry's database did not answer (a connection error: worth retrying).

    A runtime failure, not bad input (exit 1): whoever meets it last says how to finish
    the run (``--resume``)."""

    exit_code = 1

    def __init__(self, url: str, reason: str, fix: str = "") -> None:
        said = f"the registry database {url} did not answer ({reason})"
        super().__init__(f"{said}; {fix}" if fix else said)
        self.url, self.reason, self.fix = url, reason, fix

    def __reduce__(self) -> tuple[type[RegistryUnavailable], tuple[str, str, str]]:
        return (type(self), (self.url, self.reason, self.fix))

    def with_fix(self, fix: str) -> RegistryUnavailable:
        """The same error, saying how to go on."""
        return RegistryUnavailable(self.url, self.reason, fix)


def unavailable(url: str, exc: BaseException) -> RegistryUnavailable:
    """``exc`` (a connection error of the database at ``url``) as one short line: the
    URL with its password masked, the driver's reason in its own last words."""
    from vfops.registry._db import mask_url

    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    line = text.splitlines()[0].strip() if text else type(orig).__name__
    if type(orig).__module__.startswith("psycopg"):
        # 'connection failed: connection to server at "h", port 5432 failed: Connection
        # refused' -> 'Connection refused'
        line = line.rsplit(": ", 1)[-1]
    try:
        where = mask_url(url)
    except Exception:  # not a URL SQLAlchemy reads: never print what it may hold
        where = "(VFOPS_DATABASE_URL)"
    return RegistryUnavailable(where, line)


class RegistryService(Protocol):
    """Runs the registry's named operations (:data:`vfops.registry._run_ops.OPERATIONS`)."""

    database_url: str
    """The registry's URL, password included (handed to the tracker process only)."""

    async def call(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """The operation's result; :class:`RegistryUnavailable` on a connection error."""
        ...

    async def aclose(self) -> None:
        """Release what the calls hold (the child process exits)."""
        ...


def connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the database did not answer (SQLAlchemy's connection errors)."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    return isinstance(exc, OperationalError | InterfaceError)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class ThreadService:
    """The operations on ``engine``, each in a worker thread of this process."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.database_url = engine.url.render_as_string(hide_password=False)

    async def call(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        run = operation_named(operation)
        try:
            return await asyncio.to_thread(run, self.engine, *args, **kwargs)
        except Exception as exc:
            if connection_error(exc):
                raise unavailable(self.database_url, exc) from exc
            raise

    async def aclose(self) -> None:
        return None


class ProcessService:
    """The operations in a child process (``python -m vfops.registry._service_child``)
    holding the default registry's engine (``VFOPS_DATABASE_URL`` or ``$VFOPS_HOME``'s
    SQLite, read from this process's environment).

    Each call (an operation's name and its arguments) is pickled to the child over its
    stdin and run there one at a time, in the order they were made; the results come
    back over its stdout. The child exits when its stdin closes (:meth:`aclose`, or this
    process dying), so it never outlives the evaluation.
    """

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
        database_url: str,
        *,
        process: asyncio.subprocess.Process | None = None,
    ) -> None:
        self._writer = writer
        self._stdout = reader
        self._process = process
        self.database_url = database_url
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._write_lock = asyncio.Lock()
        self._gone: str | None = None
        self._reader = asyncio.create_task(self._read_replies())

    @classmethod
    async def start(cls) -> ProcessService:
        from vfops._settings import database_url

        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "vfops.registry._service_child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdin is not None and process.stdout is not None
        return cls(process.stdin, process.stdout, database_url(), process=process)

    @classmethod
    async def over(cls, channel: SideChannel) -> ProcessService:
        """Calls served by :func:`serve` in the tracker process (``SERVICE``, its side
        service: :meth:`vfops.tracking.Tracker.spawn`), over ``channel``'s pipes; they
        are this object's from now on."""
        from vfops._settings import database_url

        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(channel.read_fd, "rb", 0)
        )
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(channel.write_fd, "wb", 0)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(writer, reader, database_url())

    async def call(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        if self._gone is not None:
            raise VfopsError(self._gone)
        call_id, self._next_id = self._next_id, self._next_id + 1
        frame = pickle.dumps((call_id, operation, args, kwargs), protocol=_PROTOCOL)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[call_id] = reply
        try:
            async with self._write_lock:
                self._writer.write(_HEADER.pack(len(frame)) + frame)
                await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError):
            self._replies.pop(call_id, None)
            await asyncio.wait({self._reader})  # it says why the child is gone
            raise VfopsError(self._gone or "the registry process is gone") from None
        return await reply

    async def _read_replies(self) -> None:
        stdout = self._stdout
        try:
            while True:
                header = await stdout.readexactly(_HEADER.size)
                (size,) = _HEADER.unpack(header)
                call_id, outcome, value = pickle.loads(await stdout.readexactly(size))
                reply = self._replies.pop(call_id, None)
                if reply is None or reply.done():  # its caller was cancelled
                    continue
                if outcome == "ok":
                    reply.set_result(value)
                else:
                    reply.set_exception(_error_of(outcome, value))
        except (asyncio.IncompleteReadError, ConnectionResetError):
            pass
        gone = "the tracker process's registry service ended"
        if self._process is not None:
            gone = f"the registry process exited (code {await self._process.wait()})"
        self._gone = (
            f"{gone} before the evaluation ended; "
            "see its error above, then finish the run with vfops eval ... --resume RUN"
        )
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(VfopsError(self._gone))
        self._replies.clear()

    async def aclose(self) -> None:
        """Close the calls' input; the server answers what it has and ends (a child
        process exits, the tracker's service returns), which closes its output."""
        if not self._writer.is_closing():
            self._writer.close()
            if self._process is not None:  # a pipe transport's writer has no close waiter
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    await self._writer.wait_closed()
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), 30)
        except TimeoutError:
            if self._process is None:
                self._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reader
                return
            self._process.kill()
            await self._reader


def _error_of(outcome: str, value: Any) -> BaseException:
    """The exception a failed call raises here."""
    if outcome == "unavailable":
        url, reason = value
        return RegistryUnavailable(url, reason)
    pickled, described = value
    if pickled is not None:
        with contextlib.suppress(Exception):  # a class that does not unpickle
            exc = pickle.loads(pickled)
            if isinstance(exc, BaseException):
                return exc
    return VfopsError(str(described))


def serve(stdin: Any, stdout: Any) -> None:
    """The server's loop: read a call, run the operation it names on the default engine,
    write its outcome."""
    engine: Engine | None = None
    # at once, while the evaluation loads its environment: the imports, the connection
    # and the schema check; a failure here is met again (and reported) by the first call
    with contextlib.suppress(Exception):
        engine = _default_engine()
    while True:
        header = stdin.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the evaluation closed the pipe (or is gone)
        (size,) = _HEADER.unpack(header)
        call_id, operation, args, kwargs = pickle.loads(stdin.read(size))
        try:
            run = operation_named(operation)
            if engine is None:
                engine = _default_engine()
            reply = (call_id, "ok", run(engine, *args, **kwargs))
        except Exception as exc:
            if connection_error(exc):
                down = unavailable(_url_of(engine), exc)
                reply = (call_id, "unavailable", (down.url, down.reason))
            else:
                reply = (call_id, "error", (_pickled(exc), _first_line(exc)))
        frame = pickle.dumps(reply, protocol=_PROTOCOL)
        stdout.write(_HEADER.pack(len(frame)) + frame)
        stdout.flush()


def operation_named(name: str) -> Callable[..., Any]:
    """The registry operation called ``name`` (a :class:`VfopsError` for any other)."""
    from vfops.registry._run_ops import OPERATIONS

    try:
        return OPERATIONS[name]
    except KeyError:
        known = ", ".join(sorted(OPERATIONS))
        raise VfopsError(f"no registry operation {name!r}; use one of {known}") from None


def _url_of(engine: Engine | None) -> str:
    if engine is not None:
        return engine.url.render_as_string(hide_password=False)  # masked by unavailable()
    from vfops._settings import database_url

    return database_url()


def _default_engine() -> Engine:
    from vfops.registry import get_engine

    return get_engine()


def _pickled(exc: BaseException) -> bytes | None:
    try:
        data = pickle.dumps(exc, protocol=_PROTOCOL)
        pickle.loads(data)  # an exception whose __init__ takes other arguments does not
    except Exception:
        return None
    return data
