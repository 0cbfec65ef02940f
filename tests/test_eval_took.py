"""``vfops eval``'s summary says how long the user waited: the process's time from its
start, not its rollout phase's (which starts after the imports and the environment's
load and ends before the run is recorded)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import vfops
from vfops.testing import StubConfig, StubServer

SOURCE_ROOT = str(Path(vfops.__file__).resolve().parents[1])
DELAY_S = 1.5
"""Spent in the process before vfops is even imported: a start-up the rollout phase
never sees, and the summary's time must include."""


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:
        yield server


def _run_late(
    code: str, *, site: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``code`` in a fresh interpreter that first sleeps DELAY_S; returns the result
    and the wall time the parent saw from before the start to after the exit."""
    script = f"import time\ntime.sleep({DELAY_S})\n" + textwrap.dedent(code)
    path = [str(site)] if site else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, SOURCE_ROOT])}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    return done, time.monotonic() - started


def test_process_age_counts_from_the_process_start() -> None:
    done, waited = _run_late(
        """
        from vfops._process_clock import process_age_s, process_age_source
        print(process_age_source(), process_age_s())
        """
    )
    assert done.returncode == 0, done.stderr
    source, age = done.stdout.rsplit(" ", 1)
    assert source == "process start"
    # the sleep came before vfops was imported; clock ticks are 10 ms
    assert DELAY_S <= float(age) <= waited + 0.02


def test_eval_summary_time_is_the_process_s(
    env_site: Path, stub: StubServer, tmp_path: Path
) -> None:
    argv = [
        "vfops", "eval", "echo_env", "-m", "stub-model", "-b", stub.base_url,
        "-n", "3", "-r", "1", "-o", str(tmp_path / "out"), "--no-tracking", "-q",
    ]  # fmt: skip
    done, waited = _run_late(
        f"""
        import sys
        sys.argv = {argv!r}
        from vfops.cli import main
        main()
        """,
        site=env_site,
    )
    assert done.returncode == 0, done.stderr
    found = re.search(
        r"took\s+(\d+\.\d) s since process start \(rollouts (\d+\.\d) s, [\d.]+ rollouts/s\)",
        done.stdout,
    )
    assert found is not None, done.stdout
    took, rollouts = float(found[1]), float(found[2])
    # printed at the end (the run recorded), rounded to 0.1 s: the delay before any
    # import is in it, the rollout phase is a part of it, and the parent waited longer
    assert DELAY_S <= took + 0.05 <= waited + 0.1
    assert rollouts < took - DELAY_S + 0.05
