"""``runtime.run_uv_script`` on vfops's local runtime runs the script from a warm
interpreter (vfops/adapters/_uv_warm.py) and gives what the cold run gives: the same exit
status, stdout and stderr (a traceback included), the call's arguments and the rollout's
folder; a script whose imports print runs cold; a cancelled call's script is killed; the
zygotes end with the process. The conformance of a taskset that grades this way against
``vf-eval`` is ``v1_verified`` in test_verifiers_v1.py.

Run in .venv-v1 (``make test-v1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("verifiers.v1", reason="verifiers 0.4 is in .venv-v1 only")

from vfops.adapters import _uv_warm, _v1_speedups

SCRIPT = textwrap.dedent(
    """\
    # /// script
    # dependencies = []
    # ///
    import json
    import os
    import sys
    from fractions import Fraction

    mode = sys.argv[1]
    print(json.dumps({"args": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0],
                      "parent": os.getppid(), "half": str(Fraction(1, 2))}))
    if mode == "raise":
        raise ValueError("no " + sys.argv[2])
    if mode == "exit":
        sys.exit(int(sys.argv[2]))
    if mode == "message":
        sys.exit("stopped: " + sys.argv[2])
    if mode == "wait":
        open("pid", "w").write(str(os.getpid()))
        sys.stdin.read()  # /dev/null when warm: stops at once
        import time
        time.sleep(600)
    """
).encode()

PRINTS_ON_IMPORT = b"""# /// script
# dependencies = []
# ///
import this
import os
print(os.getppid())
"""


@pytest.fixture
def runtime() -> Iterator[Any]:
    from verifiers.v1.runtimes.subprocess import CACHE_DIR, SubprocessConfig, SubprocessRuntime

    local = _v1_speedups._lazy_runtime_class(
        SubprocessRuntime, CACHE_DIR / "runtimes" / "subprocess"
    )
    _uv_warm._stop_all()
    yield local(SubprocessConfig(), name=f"uv-warm-{os.getpid()}-{id(local)}")
    _uv_warm._stop_all()


@contextlib.asynccontextmanager
async def _started(runtime: Any) -> AsyncIterator[Any]:
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.teardown()


def _mode(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("VFOPS_UV_SCRIPTS", mode)


@pytest.mark.parametrize(
    "args", [["ok", "a b"], ["raise", "x"], ["exit", "3"], ["message", "why"], ["exit", "0"]]
)
def test_a_warm_call_gives_what_a_cold_call_gives(
    runtime: Any, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    async def both() -> dict[str, Any]:
        results = {}
        async with _started(runtime) as started:
            for mode in ("warm", "cold"):
                _mode(monkeypatch, mode)
                results[mode] = await started.run_uv_script(SCRIPT, args)
        return results

    results = asyncio.run(both())
    warm, cold = results["warm"], results["cold"]
    assert (warm.exit_code, warm.stderr) == (cold.exit_code, cold.stderr)
    warm_out, cold_out = json.loads(warm.stdout), json.loads(cold.stdout)
    # the same output but for who started it: the zygote, not the evaluation
    zygote_pids = {z.process.pid for z in _uv_warm._zygotes.values() if z is not None}
    assert warm_out.pop("parent") in zygote_pids and cold_out.pop("parent") == os.getpid()
    assert warm_out == cold_out and warm_out["args"] == args
    assert warm_out["cwd"] == str(runtime.workdir)
    if args[0] == "raise":
        assert warm.stderr.startswith("Traceback") and "ValueError: no x" in warm.stderr
        assert "runpy" not in warm.stderr  # the cold traceback, not the zygote's frames


def test_a_script_whose_imports_print_runs_cold(
    runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _mode(monkeypatch, "warm")

    async def call() -> Any:
        async with _started(runtime) as started:
            return await started.run_uv_script(PRINTS_ON_IMPORT, [])

    result = asyncio.run(call())
    assert result.exit_code == 0 and "Zen of Python" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == str(os.getpid())  # started cold
    assert list(_uv_warm._zygotes.values()) == [None]  # and stays cold


def test_a_cancelled_call_kills_its_script(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _mode(monkeypatch, "warm")

    async def cancel() -> int:
        async with _started(runtime) as started:
            call = asyncio.ensure_future(started.run_uv_script(SCRIPT, ["wait", "-"]))
            pid_file = Path(started.workdir) / "pid"
            while not pid_file.exists() or not pid_file.read_text():
                assert not call.done(), call.result()
                await asyncio.sleep(0.01)  # polling a state: the script has started
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            return int(pid_file.read_text())

    pid = asyncio.run(cancel())
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=30)  # killed and reaped by its zygote
    assert not psutil.pid_exists(pid)


def test_the_zygotes_end_with_the_process(tmp_path: Path) -> None:
    program = textwrap.dedent(
        f"""
        import asyncio, os
        from verifiers.v1.runtimes.subprocess import CACHE_DIR, SubprocessConfig, SubprocessRuntime
        from vfops.adapters import _uv_warm, _v1_speedups
        SCRIPT = {SCRIPT!r}
        root = CACHE_DIR / "runtimes" / "subprocess"
        local = _v1_speedups._lazy_runtime_class(SubprocessRuntime, root)
        async def main():
            runtime = local(SubprocessConfig(), name=f"uv-exit-{{os.getpid()}}")
            await runtime.start()
            result = await runtime.run_uv_script(SCRIPT, ["ok", "-"])
            await runtime.teardown()
            (zygote,) = _uv_warm._zygotes.values()
            print(zygote.process.pid, result.exit_code)
        asyncio.run(main())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "VFOPS_UV_SCRIPTS"}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    zygote_pid, code = (int(x) for x in done.stdout.split())
    assert code == 0
    assert not psutil.pid_exists(zygote_pid) or psutil.Process(zygote_pid).status() == "zombie"
