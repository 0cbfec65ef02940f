"""A warm interpreter for one uv script: run as a program by the script's own interpreter
(``INTERPRETER -c SOURCE SCRIPT SOCKET``), stdlib only (the script's environment does
not have vfops). See :mod:`vfops.adapters._uv_warm` for why and for the client side.

It sets up what a cold ``INTERPRETER SCRIPT`` would have (``sys.path[0]`` the script's
folder), imports the modules the script imports at its top level, then prints one line:
``ready`` — or ``cold REASON`` and exits, when the warm start could change what the script
does (an import failed, wrote to stdout/stderr, or left a thread running: a fork would
not copy it). Then, for each request on the Unix socket (one JSON line: ``args``,
``cwd``, ``stdout``, ``stderr`` — files the output goes to), it forks a child that
becomes the cold run: its own session, those files as fds 1 and 2, ``/dev/null`` as
fd 0, the zygote's environment (the one the script would start with) in the request's
folder, ``sys.argv`` of the script, the
script run as ``__main__``, its ``atexit`` functions, its exit status as Python's own.
The answer is ``{"pid": N}`` at once and ``{"exit": CODE}`` when the child ends
(negative: the signal that killed it). The zygote ends when its stdin closes (its
parent is gone) or on SIGTERM.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback


def _top_level_imports(path: str) -> list[str]:
    with open(path, "rb") as handle:
        tree = ast.parse(handle.read(), path)
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _warm_up(path: str) -> str | None:
    """Import the script's top-level imports; the reason a warm start is unsafe, or None."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for name in _top_level_imports(path):
                __import__(name)
    except BaseException as exc:  # the cold run meets it too, in its own process
        return f"importing the script's modules raised {type(exc).__name__}"
    if out.getvalue() or err.getvalue():
        return "importing the script's modules wrote output"
    if threading.active_count() > 1:
        return "importing the script's modules started a thread"
    return None


_OWN_FDS: list[int] = []
"""The zygote's own descriptors (socket, wake-up pipe, selector): a child closes them."""


def _child(path: str, request: dict[str, object]) -> None:
    """Become ``INTERPRETER SCRIPT ARGS`` in the request's folder and environment."""
    code = 1
    try:
        os.setsid()
        for fd in _OWN_FDS:
            with contextlib.suppress(OSError):
                os.close(fd)
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:  # `random` reseeds itself after a fork; numpy does not
            numpy_random.seed()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(str(request["stdout"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(str(request["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        # the environment is the zygote's: verifiers' wrapper made it for this script
        os.chdir(str(request["cwd"]))
        if "PWD" in os.environ:  # a shell's record of the folder it started in
            os.environ["PWD"] = str(request["cwd"])
        sys.argv = [path, *[str(a) for a in list(request["args"])]]  # type: ignore[call-overload]
        code = _run(path)
        atexit._run_exitfuncs()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


def _run(path: str) -> int:
    """The script as ``__main__``; its exit status as the interpreter would give it."""
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        # the traceback from the script's own frames on, as a cold run prints it
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        return 1
    return 0


def main() -> None:
    path, address = sys.argv[1], sys.argv[2]
    sys.argv = [path]
    sys.path[0] = os.path.dirname(os.path.realpath(path))  # as `python SCRIPT` sets it
    reason = _warm_up(path)
    if reason is not None:
        print(f"cold {reason}", flush=True)
        return
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    _OWN_FDS.extend([server.fileno(), wake_read, wake_write, selector.fileno()])
    waiting: dict[int, socket.socket] = {}
    buffers: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in selector.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    return  # the parent is gone
            elif key.data == "accept":
                conn, _ = server.accept()
                _OWN_FDS.append(conn.fileno())
                buffers[conn] = b""
                selector.register(conn, selectors.EVENT_READ, "request")
            elif key.data == "child":
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                _reap(waiting)
            else:
                conn = key.fileobj  # type: ignore[assignment]
                assert isinstance(conn, socket.socket)
                data = conn.recv(1 << 16)
                buffers[conn] += data
                if not data or b"\n" in buffers[conn]:
                    selector.unregister(conn)
                    line = buffers.pop(conn)
                    if not data and b"\n" not in line:
                        with contextlib.suppress(ValueError):
                            _OWN_FDS.remove(conn.fileno())
                        conn.close()
                        continue
                    _start(path, json.loads(line.split(b"\n", 1)[0]), conn, waiting)
        _reap(waiting)


def _start(
    path: str, request: dict[str, object], conn: socket.socket, waiting: dict[int, socket.socket]
) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(path, request)
    waiting[pid] = conn
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(ValueError):
                _OWN_FDS.remove(conn.fileno())
            with contextlib.suppress(OSError):
                conn.sendall(
                    json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
                )
            conn.close()


if __name__ == "__main__":
    main()
