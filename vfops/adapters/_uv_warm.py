"""``runtime.run_uv_script`` on the local runtime, from a warm interpreter.

A v1 reward that verifies in the rollout's runtime (upstream ``gsm8k``: ``verify.py``
with ``math-verify``) runs ``uv``'s interpreter on the script once per rollout: ~1.6 s
of CPU here, nearly all of it starting Python and importing sympy, so that pair was
bound by its scoring on both sides (bench/README.md, ``v1_conformance.py``). Here each
distinct (script, environment) gets one zygote (:mod:`vfops.adapters._uv_zygote`),
started exactly as ``verifiers`` starts the script (its ``sh`` wrapper, its environment,
the interpreter ``uv`` prepared) but told to import the script's top-level imports and
wait; each call is a child forked from it that runs the script as ``__main__`` with the
call's arguments, in the rollout's folder, output to files read back as ``verifiers``
reads its pipes. What the script computes is what a cold start computes; a zygote that
cannot promise that (an import that fails, prints or starts a thread) says so and the
script runs cold, as ``verifiers`` runs it, for the rest of the process. So does any
failure to reach a zygote. Differences left, all outside what a script's result can
depend on unless it reads them: stdin is ``/dev/null`` (``verifiers`` leaves the
evaluation's own), and children share the zygote's string-hash seed.

Only for ``verifiers``' subprocess runtime (a container runtime's commands run in its
container). ``VFOPS_UV_SCRIPTS=cold`` turns it off.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["run_warm"]

_MAX_ZYGOTES: Final = 8
"""Per process; a run with more distinct (script, environment) pairs runs the rest cold."""

_START_TIMEOUT_S: Final = 120.0
"""For a zygote's imports (sympy's are ~1 s here; a loaded machine is slower)."""


@dataclass
class _Zygote:
    process: subprocess.Popen[bytes]
    address: str
    folder: str


_zygotes: dict[tuple[Any, ...], _Zygote | None] = {}
_lock = threading.Lock()


async def run_warm(
    runtime: Any, script: str | bytes, args: list[str], env: dict[str, str]
) -> Any | None:
    """The script's ``ProgramResult`` from a warm zygote, or ``None``: run it cold."""
    if os.environ.get("VFOPS_UV_SCRIPTS") == "cold":
        return None
    argv = await runtime.prepare_uv_script(script, env)
    full_env = {k: v for k, v in os.environ.items() if "API_KEY" not in k.upper()}
    full_env.update(runtime.process_env(env))  # as verifiers' SubprocessRuntime.run builds it
    key = (tuple(argv), tuple(sorted(full_env.items())))
    zygote = await asyncio.to_thread(_zygote_for, key, argv, full_env)
    if zygote is None:
        return None
    return await _call(zygote, key, argv[-1], args, str(runtime.workdir))


def _zygote_for(key: tuple[Any, ...], argv: list[str], env: dict[str, str]) -> _Zygote | None:
    with _lock:
        if key in _zygotes:
            zygote = _zygotes[key]
            if zygote is None or zygote.process.poll() is None:
                return zygote
        elif len(_zygotes) >= _MAX_ZYGOTES:
            return None
        _zygotes[key] = zygote = _start(argv, env)
        return zygote


def _start(argv: list[str], env: dict[str, str]) -> _Zygote | None:
    """``argv`` is verifiers' ``[sh, -c, WRAPPER, uv-script, VENV, INTERPRETER, SCRIPT]``:
    the same wrapper runs ``INTERPRETER -c ZYGOTE SCRIPT SOCKET`` instead."""
    source = Path(__file__).with_name("_uv_zygote.py").read_text()
    folder = tempfile.mkdtemp(prefix="vfops-uv-")
    address = os.path.join(folder, "socket")
    script = argv[-1]
    process = subprocess.Popen(
        [*argv[:-1], "-c", source, script, address],
        env=env,
        cwd=os.path.dirname(script),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the evaluation is not the zygote's
    )
    assert process.stdout is not None
    ready = _read_line(process, _START_TIMEOUT_S)
    if ready != "ready":  # "cold REASON", or it failed to start: verifiers' way, cold
        _stop(process)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return _Zygote(process, address, folder)


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return line[0].decode().strip() if line else ""


async def _call(
    zygote: _Zygote, key: tuple[Any, ...], script: str, args: list[str], cwd: str
) -> Any | None:
    from verifiers.v1.runtimes.base import ProgramResult

    with tempfile.TemporaryDirectory(prefix="vfops-uv-call-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        request = {"args": args, "cwd": cwd, "stdout": out, "stderr": err}
        try:
            reader, writer = await asyncio.open_unix_connection(zygote.address)
        except OSError:  # it is gone: this call and the rest cold
            _forget(key)
            return None
        pid: int | None = None
        code: int | None = None
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            started = await reader.readline()
            if not started:
                _forget(key)
                return None
            pid = int(json.loads(started)["pid"])
            ended = await reader.readline()
            if not ended:  # the zygote died with the child running: no status to give
                raise RuntimeError(f"the warm interpreter of {script} stopped")
            code = int(json.loads(ended)["exit"])
        finally:
            if code is None and pid is not None:
                # cancelled (a scoring timeout): kill the child's session, as verifiers
                # kills the cold run's process group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            writer.close()
        # a script's output is small, read as verifiers decodes its pipes
        return ProgramResult(exit_code=code or 0, stdout=_text(out), stderr=_text(err))


def _text(path: str) -> str:
    return Path(path).read_bytes().decode(errors="replace")


def _forget(key: tuple[Any, ...]) -> None:
    with _lock:
        zygote = _zygotes.get(key)
        _zygotes[key] = None
    if zygote is not None:
        _stop(zygote.process)
        shutil.rmtree(zygote.folder, ignore_errors=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()  # its signal to end
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


@atexit.register
def _stop_all() -> None:
    with _lock:
        zygotes = [z for z in _zygotes.values() if z is not None]
        _zygotes.clear()
    for zygote in zygotes:
        _stop(zygote.process)
        shutil.rmtree(zygote.folder, ignore_errors=True)
