"""Reward functions that hang: a per-call scoring time limit, and the event loop (and
with it SIGINT/SIGTERM) never blocked by a sync function (issue 25, defect 4).

A timed-out call is an error of its rollout (stage ``scoring``, reward ``None``), never
a 0.0; a sync call runs in a daemon scoring thread, so that a hung one neither blocks
the loop nor keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.test_bad_input import registry_url
from vfops._errors import VfopsError
from vfops._settings import DEFAULT_SCORING_TIMEOUT_S
from vfops._types import Messages, State
from vfops.clients._scripted import ScriptedClient
from vfops.rubrics import JudgeRubric, MathRubric, Rubric, RubricGroup
from vfops.testing import StubConfig, StubServer

LIMIT = 0.05  # seconds: tiny, so that a hung call fails the test run quickly


def make_state(text: str, index: int) -> State:
    return {
        "prompt": [{"role": "user", "content": "What is 2+2?"}],
        "completion": [{"role": "assistant", "content": text}],
        "answer": "4",
        "info": {},
        "task": "arith",
        "example_id": 0,
        "rollout_index": index,
    }


def reply(completion: Messages) -> str:
    return str(completion[-1]["content"])


def exact(completion: Messages, answer: str) -> float:
    return 1.0 if reply(completion) == answer else 0.0


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: lets the blocked scoring threads return."""
    event = threading.Event()
    yield event
    event.set()


def assert_timed_out(score: Any, name: str) -> None:
    assert score.reward is None  # never 0.0
    assert score.error is not None
    assert score.error.stage == "scoring" and score.error.type == "ScoringTimeout"
    assert repr(name) in score.error.message and f"{LIMIT:g} s" in score.error.message
    assert "VFOPS_SCORING_TIMEOUT_S" in score.error.message


async def test_a_hung_async_and_a_hung_sync_reward_time_out_others_are_scored(
    release: threading.Event,
) -> None:
    forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def judge_like(completion: Messages) -> float:
        if reply(completion) == "hang async":
            await forever
        return 0.5

    def parser_like(completion: Messages) -> float:
        if reply(completion) == "hang sync":
            release.wait()
        return 0.25

    rubric = Rubric([exact, judge_like, parser_like], scoring_timeout_s=LIMIT)
    states = [make_state("4", 0), make_state("hang async", 1), make_state("hang sync", 2)]
    scores = await rubric.score_group(states)

    assert scores[0].error is None and scores[0].reward == 1.75
    assert_timed_out(scores[1], "judge_like")
    assert_timed_out(scores[2], "parser_like")
    # the other functions of a timed-out rollout still ran and are recorded
    assert scores[1].metrics == {"exact": 0.0, "parser_like": 0.25}
    assert scores[2].metrics == {"exact": 0.0, "judge_like": 0.5}
    # the hung sync call left the pool: the next group is scored as usual
    again = await rubric.score_group([make_state("4", 0), make_state("5", 1)])
    assert [s.reward for s in again] == [1.75, 0.75]


async def test_the_sync_calls_after_a_hung_one_still_run(release: threading.Event) -> None:
    """The group's sync calls run one after another in one thread: those after the hung
    call run in a fresh thread, each within its own limit."""
    calls: list[int] = []

    def first(rollout_index: int) -> float:
        calls.append(rollout_index)
        if rollout_index == 0:
            release.wait()
        return 1.0

    scores = await Rubric([first], scoring_timeout_s=LIMIT).score_group(
        [make_state("4", i) for i in range(3)]
    )
    assert_timed_out(scores[0], "first")
    assert [s.reward for s in scores[1:]] == [1.0, 1.0]
    assert calls == [0, 1, 2]  # nothing ran twice


async def test_hung_group_functions_time_out_for_the_whole_group(
    release: threading.Event,
) -> None:
    forever: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def rank_sync(completions: list[Messages]) -> list[float]:
        release.wait()
        return [1.0] * len(completions)

    async def rank_async(completions: list[Messages]) -> list[float]:
        await forever
        return [1.0] * len(completions)

    for func in (rank_sync, rank_async):
        scores = await Rubric([func], scoring_timeout_s=LIMIT).score_group(
            [make_state("4", 0), make_state("4", 1)]
        )
        for score in scores:
            assert_timed_out(score, func.__name__)


async def test_rubric_group_and_judge_rubric_calls_are_limited(
    release: threading.Event,
) -> None:
    def stuck(completion: Messages) -> float:
        release.wait()
        return 1.0

    async def stuck_judge(judge: Any, completion: Messages) -> float:
        await asyncio.get_running_loop().create_future()
        return 1.0

    judge = JudgeRubric(
        ScriptedClient(["yes"], cycle=True), funcs=[stuck_judge], scoring_timeout_s=LIMIT
    )
    group = RubricGroup([Rubric([exact, stuck], scoring_timeout_s=LIMIT), judge])
    [score] = await group.score_group([make_state("4", 0)])
    assert score.reward is None
    assert score.error is not None and score.error.type == "ScoringTimeout"
    assert score.metrics == {"exact": 1.0}


async def test_judge_calls_do_not_count_against_the_limit() -> None:
    """A judge call is bounded by its client's timeout and retries; waiting for it (or
    for one of the judge's few slots) is no sign of a hung function."""
    # the judge answers after 4x the limit (max_concurrent=1: the second waits 8x)
    client = ScriptedClient(["yes", "no"], delay_s=4 * LIMIT)
    rubric = JudgeRubric(client, max_concurrent=1, scoring_timeout_s=LIMIT)
    scores = await rubric.score_group([make_state("4", 0), make_state("5", 1)])
    assert [s.error for s in scores] == [None, None]
    assert [s.reward for s in scores] == [1.0, 0.0]


async def test_a_sync_reward_never_blocks_the_event_loop() -> None:
    """The sync function waits for the loop to release it: run on the loop, it would
    wait out its 30 s and score 0.0."""
    entered, released = threading.Event(), threading.Event()

    def waits_for_the_loop(completion: Messages) -> float:
        entered.set()
        return 1.0 if released.wait(timeout=30) else 0.0

    async def loop_side() -> None:
        await asyncio.to_thread(entered.wait, 30)
        released.set()

    helper = asyncio.create_task(loop_side())
    [score] = await Rubric([waits_for_the_loop]).score_group([make_state("4", 0)])
    await helper
    assert score.error is None and score.reward == 1.0


def test_a_spinning_sync_reward_is_stopped_after_its_limit() -> None:
    """A pure-Python loop past its limit is stopped in its thread (it would otherwise
    keep a core busy for the rest of the run)."""
    stopped = threading.Event()

    def spins(completion: Messages) -> float:
        try:
            while True:
                pass
        finally:
            stopped.set()

    [score] = asyncio.run(
        Rubric([spins], scoring_timeout_s=LIMIT).score_group([make_state("4", 0)])
    )
    assert_timed_out(score, "spins")
    assert stopped.wait(timeout=30)


def test_a_hung_sync_reward_does_not_keep_the_process_from_exiting(tmp_path: Path) -> None:
    """concurrent.futures' threads (asyncio.to_thread's) are joined at exit: a hung call
    there would keep the process alive for ever. Scoring threads are daemons."""
    script = textwrap.dedent(
        """
        import asyncio, threading
        from vfops.rubrics import Rubric

        def hangs(completion) -> float:
            threading.Event().wait()
            return 1.0

        state = {"completion": [{"role": "assistant", "content": "4"}]}
        [score] = asyncio.run(Rubric([hangs], scoring_timeout_s=0.05).score_group([state]))
        print(score.error.type)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ScoringTimeout"


def test_the_limit_comes_from_the_rubric_or_vfops_scoring_timeout_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VFOPS_SCORING_TIMEOUT_S", raising=False)
    assert Rubric().scoring_timeout_s == DEFAULT_SCORING_TIMEOUT_S == 60.0
    monkeypatch.setenv("VFOPS_SCORING_TIMEOUT_S", "2.5")
    assert Rubric().scoring_timeout_s == 2.5
    assert MathRubric().scoring_timeout_s == 2.5
    assert Rubric(scoring_timeout_s=0).scoring_timeout_s == 0  # no limit
    monkeypatch.setenv("VFOPS_SCORING_TIMEOUT_S", "soon")
    with pytest.raises(VfopsError, match=r"VFOPS_SCORING_TIMEOUT_S must be a number of seconds"):
        Rubric()
    with pytest.raises(VfopsError, match=r"scoring_timeout_s must be a number of seconds >= 0"):
        Rubric(scoring_timeout_s=-1)


# --- through the real CLI ---------------------------------------------------------------

HUNG_ENV = """
import threading

import vfops


def hangs(completion) -> float:
    threading.Event().wait()  # for ever: a deadlocked grader, a socket with no timeout
    return 1.0


def load_environment() -> vfops.Environment:
    rows = [{"question": f"Say {i}.", "answer": str(i)} for i in range(4)]
    return vfops.SingleTurnEnv(eval_dataset=rows, rubric=vfops.Rubric([hangs]))
"""

HUNG_PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "vfops-hung-reward-env"
version = "0.0.1"

[project.entry-points."vfops.environments"]
hung_reward = "hung_reward:load_environment"

[tool.setuptools]
py-modules = ["hung_reward"]
"""


@pytest.fixture(scope="module")
def hung_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An environment whose only (sync) reward function never returns, pip-installed."""
    package = tmp_path_factory.mktemp("hung_pkg")
    (package / "pyproject.toml").write_text(HUNG_PYPROJECT)
    (package / "hung_reward.py").write_text(HUNG_ENV)
    site = tmp_path_factory.mktemp("hung_site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(package)],
        check=True, capture_output=True,
    )  # fmt: skip
    return site


def _registry_status(tmp: Path) -> str | None:
    if not (tmp / "home" / "registry.db").exists():
        return None
    engine = create_engine(registry_url(tmp), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            found = connection.execute(text("SELECT status FROM eval_runs")).scalars().all()
    except Exception:  # the schema is being created
        return None
    finally:
        engine.dispose()
    return str(found[0]) if found else None


def test_sigterm_stops_an_eval_whose_sync_reward_hangs(hung_site: Path, tmp_path: Path) -> None:
    """Every rollout's reward function hangs (no limit): SIGTERM still stops the run at
    once, exit 143, recorded ``interrupted`` in the folder and the registry."""
    env = {
        **os.environ,
        "PYTHONPATH": str(hung_site),
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_TRACKING": "0",
        "VFOPS_SCORING_TIMEOUT_S": "0",  # no limit: only the signal can end the run
    }
    env.pop("VFOPS_DATABASE_URL", None)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "hung_reward", "-m", "stub-model", "-b", stub.base_url, "-n", "4",
                "-r", "2", "-o", str(tmp_path / "out")]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # started: the run is open in the registry and every group was generated
            # (its scoring is what hangs)
            deadline = time.monotonic() + 240  # a safety net: it returns on the state
            while time.monotonic() < deadline and not (
                _registry_status(tmp_path) == "running" and stub.stats["requests"] >= 8
            ):
                assert process.poll() is None, process.communicate()[1]
                time.sleep(0.05)
            assert stub.stats["requests"] >= 8, "the run never got going"
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=60)  # a safety net: it exits at once
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    (metadata_path,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    assert orjson.loads(metadata_path.read_bytes())["status"] == "interrupted"
    assert _registry_status(tmp_path) == "interrupted"
