"""Rewards are contained (issue 44, deliverable 10): a reward function that exhausts
memory errors its own rollout, never the eval, and the processes a reward function
starts end with it — after its call, when its call is killed, and when the eval ends or
is killed.

Sync reward functions run in scoring workers (:mod:`vfops.rubrics._workers`): forked
processes whose data segment may grow ``VFOPS_SCORING_MEMORY_MB`` (set to 512 here; the
rewards allocate 2 GB) and which end whatever their calls start. Every check of "no
process left" reads ``/proc/*/cmdline`` for a marker unique to the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson
import pytest

from vfops._errors import InvalidArgumentError
from vfops._types import State
from vfops.envs import EnvGroup, SingleTurnEnv
from vfops.rubrics import RolloutScore, Rubric
from vfops.rubrics._workers import ScoringWorkers, scoring_workers, start_scoring_workers
from vfops.testing import StubConfig, StubServer

LIMIT_MB = 512
HOG_BYTES = 2 << 30  # four times the limit: never allocated on the CI machine

CONTAINED_ENV = """
import os
import subprocess

import vfops

MARKER = os.environ["CONTAINED_TEST_MARKER"]


def correct(completion, answer) -> float:
    return 1.0 if answer in completion[-1]["content"] else 0.0


def greedy(answer, rollout_index) -> float:
    if answer == "1" and rollout_index == 0:  # one rollout of eight: 2 GB
        buffer = bytearray(2 << 30)
        return float(len(buffer))
    return 0.0


def spawner(answer) -> float:
    # a child, and a daemon that left the session (setsid) and its parent (double fork)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # not the eval's pipes
    subprocess.Popen(["bash", "-c", f"exec -a {MARKER} sleep 1000"], **quiet)
    subprocess.Popen(["sh", "-c", f"setsid bash -c 'exec -a {MARKER} sleep 1000' &"], **quiet)
    return 0.0


def load_environment() -> vfops.Environment:
    rows = [{"question": f"Say {i}. ANSWER_HINT: {i}", "answer": str(i)} for i in range(4)]
    rubric = vfops.Rubric([correct, greedy, spawner], weights=[1.0, 1.0, 0.0])
    return vfops.SingleTurnEnv(eval_dataset=rows, rubric=rubric)


async def greedy_async(answer, rollout_index) -> float:
    # in the eval's own process: 2 GB a megabyte at a time (bounded, should the limit fail)
    if answer == "1" and rollout_index == 0:
        chunks = [bytearray(1 << 20) for _ in range(2048)]
        return float(len(chunks))
    return 0.0


def load_async() -> vfops.Environment:
    rows = [{"question": f"Say {i}. ANSWER_HINT: {i}", "answer": str(i)} for i in range(4)]
    rubric = vfops.Rubric([correct, greedy_async], weights=[1.0, 1.0])
    return vfops.SingleTurnEnv(eval_dataset=rows, rubric=rubric)


class Starting(vfops.SingleTurnEnv):
    # its rollout code (not a reward) starts a child and a setsid daemon

    async def setup_state(self, state):
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.Popen(["bash", "-c", f"exec -a {MARKER} sleep 1000"], **quiet)
        subprocess.Popen(["sh", "-c", f"setsid bash -c 'exec -a {MARKER} sleep 1000' &"], **quiet)
        return await super().setup_state(state)


def load_starting() -> vfops.Environment:
    rows = [{"question": f"Say {i}. ANSWER_HINT: {i}", "answer": str(i)} for i in range(2)]
    return Starting(eval_dataset=rows, rubric=vfops.Rubric([correct]))
"""


@pytest.fixture(scope="module")
def contained_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environment above, found by its entry point (a dist-info folder: no pip)."""
    site = tmp_path_factory.mktemp("contained_site")
    (site / "contained_rewards.py").write_text(CONTAINED_ENV)
    info = site / "vfops_contained_rewards-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vfops-contained-rewards\nVersion: 0.0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[vfops.environments]\ncontained_rewards = contained_rewards:load_environment\n"
        "contained_starting = contained_rewards:load_starting\n"
        "contained_async = contained_rewards:load_async\n"
    )
    return site


def marked(marker: str, *, named: bool = False) -> list[int]:
    """The processes whose command line holds ``marker`` (``named``: as its argv[0])."""
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        held = cmdline.split(b"\0")[0] == marker.encode() if named else marker.encode() in cmdline
        if held and state != b"Z":  # a zombie is no process left
            found.append(int(name))
    return found


def wait_until_none(marker: str, deadline_s: float = 30.0) -> list[int]:
    """Polls until no process holds ``marker`` (a safety net: it returns on the state)."""
    deadline = time.monotonic() + deadline_s
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return marked(marker)


@pytest.fixture
def marker() -> Iterator[str]:
    """A unique marker; anything still holding it at the end is killed (by pid)."""
    value = f"vfops-contained-{uuid.uuid4().hex[:12]}"
    yield value
    for pid in marked(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def eval_env(contained_site: Path, tmp_path: Path, marker: str) -> dict[str, str]:
    """A ``vfops eval`` subprocess's environment: the site above, a private home, no
    tracking, the test's memory limit and marker, the default workers."""
    env = {
        **os.environ,
        "PYTHONPATH": str(contained_site),
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_TRACKING": "0",
        "VFOPS_SCORING_MEMORY_MB": str(LIMIT_MB),
        "CONTAINED_TEST_MARKER": marker,
    }
    for name in ("VFOPS_DATABASE_URL", "VFOPS_SCORING_WORKERS"):
        env.pop(name, None)
    return env


def test_eval_a_reward_past_the_memory_limit_errors_its_rollout_and_what_rewards_start_ends(
    contained_site: Path, tmp_path: Path, marker: str
) -> None:
    """One rollout's reward allocates 2 GB under a 512 MiB limit: that rollout is an
    error naming the limit and how to raise it (never scored), the seven others are
    scored, the eval completes and exits 0; every reward call also started two sleeps
    (one a setsid daemon): none is left once the eval has exited."""
    env = eval_env(contained_site, tmp_path, marker)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "contained_rewards", "-m", "stub-model", "-b", stub.base_url, "-n", "4",
                "-r", "2", "-o", str(tmp_path / "out"), "--max-error-rate", "0.25"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,  # a safety net
        )
    assert done.returncode == 0, done.stderr
    assert marked(marker) == []  # at exit: nothing the rewards started is left
    (run_dir,) = (tmp_path / "out").glob("evals/*/*")
    assert orjson.loads((run_dir / "metadata.json").read_bytes())["status"] == "completed"
    rows = [orjson.loads(line) for line in (run_dir / "results.jsonl").read_bytes().splitlines()]
    assert len(rows) == 8
    errored = [row for row in rows if row["error"] is not None]
    assert len(errored) == 1
    (error_row,) = errored
    assert (error_row["answer"], error_row["rollout_index"]) == ("1", 0)
    assert error_row["reward"] is None
    error = error_row["error"]
    assert error["type"] == "ScoringMemoryLimit" and error["stage"] == "scoring"
    assert f"{LIMIT_MB} MiB" in error["message"] and "VFOPS_SCORING_MEMORY_MB" in error["message"]
    assert "'greedy'" in error["message"]
    assert all(row["reward"] == 1.0 for row in rows if row["error"] is None)


@pytest.mark.parametrize(
    ("env_name", "workers", "reward"),
    [("contained_async", None, "greedy_async"), ("contained_rewards", "0", "greedy")],
    ids=["async-reward", "sync-reward-without-workers"],
)
def test_a_reward_scoring_in_the_eval_process_past_the_limit_errors_only_its_rollout(
    contained_site: Path,
    tmp_path: Path,
    marker: str,
    env_name: str,
    workers: str | None,
    reward: str,
) -> None:
    """What scores in the eval's own process (an async reward; a sync one when there are
    no workers) does so under the same allowance: one rollout's 2 GB is its
    ``ScoringMemoryLimit`` error, the other rollouts are scored, the eval completes."""
    env = eval_env(contained_site, tmp_path, marker)
    if workers is not None:
        env["VFOPS_SCORING_WORKERS"] = workers
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", env_name, "-m", "stub-model", "-b", stub.base_url, "-n", "4",
                "-r", "2", "-o", str(tmp_path / "out"), "--max-error-rate", "0.25"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,  # a safety net
        )
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "out").glob("evals/*/*")
    assert orjson.loads((run_dir / "metadata.json").read_bytes())["status"] == "completed"
    rows = [orjson.loads(line) for line in (run_dir / "results.jsonl").read_bytes().splitlines()]
    errored = [row for row in rows if row["error"] is not None]
    assert [(row["answer"], row["rollout_index"]) for row in errored] == [("1", 0)]
    error = errored[0]["error"]
    assert error["type"] == "ScoringMemoryLimit", error
    assert f"{LIMIT_MB} MiB" in error["message"] and f"'{reward}'" in error["message"]
    assert errored[0]["reward"] is None
    assert [row["reward"] for row in rows if row["error"] is None] == [1.0] * 7


def test_what_the_environments_rollout_code_starts_ends_with_vfops_eval(
    contained_site: Path, tmp_path: Path, marker: str
) -> None:
    """Each rollout's setup starts a sleep and a setsid daemon (which leaves its parent
    at once): once `vfops eval` has exited, none of them is left, and the run
    completed."""
    env = {
        **os.environ,
        "PYTHONPATH": str(contained_site),
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_TRACKING": "0",
        "CONTAINED_TEST_MARKER": marker,
    }
    env.pop("VFOPS_DATABASE_URL", None)
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "contained_starting", "-m", "stub-model", "-b", stub.base_url, "-n",
                "2", "-r", "2", "-o", str(tmp_path / "out")]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "vfops", *args], env=env, capture_output=True, text=True,
            timeout=240,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert marked(marker) == []  # at exit: nothing the rollouts started is left
    (run_dir,) = (tmp_path / "out").glob("evals/*/*")
    assert orjson.loads((run_dir / "metadata.json").read_bytes())["status"] == "completed"


def state(index: int) -> State:
    return {
        "prompt": [{"role": "user", "content": "What is 2+2?"}],
        "completion": [{"role": "assistant", "content": "4"}],
        "answer": "4",
        "info": {},
        "task": "arith",
        "example_id": 0,
        "rollout_index": index,
    }


def exact(completion: list[dict[str, str]], answer: str) -> float:
    return 1.0 if completion[-1]["content"] == answer else 0.0


async def with_workers(
    rubric: Rubric, states: list[State]
) -> tuple[list[RolloutScore], ScoringWorkers]:
    # this process may run pytest-xdist's and the stub's threads, which hold no lock the
    # zygote needs
    workers = start_scoring_workers(allow_threads=True)
    assert workers is not None
    try:
        return list(await rubric.score_group(states)), workers
    finally:
        await workers.aclose()


async def _pids_of(
    rubric: Rubric, groups: int, size: int, first: Sequence[list[State]] = ()
) -> tuple[set[float], int]:
    """The pids that scored ``groups`` concurrent groups (after the groups of ``first``,
    scored one after another), and the zygote's."""
    workers = start_scoring_workers(allow_threads=True)
    assert workers is not None
    try:
        scored = [await rubric.score_group(group) for group in first]
        scored += await asyncio.gather(
            *(rubric.score_group([state(i) for i in range(size)]) for _ in range(groups))
        )
    finally:
        await workers.aclose()
    pids = {score.reward for group in scored for score in group if score.reward is not None}
    return pids, workers.zygote


GROWTH_REWARDS = """
import os, time
from pathlib import Path


def pid_of(rollout_index):
    if rollout_index == 9:  # a slow first call: a worker's warm-up
        time.sleep(0.05)
    return float(os.getpid())


def meet(rollout_index):
    # rollout 9: busy 50 ms; the others wait (up to 10 s) until three processes are in
    # this function at once
    if rollout_index == 9:
        time.sleep(0.05)
        return float(os.getpid())
    folder = os.environ["MEET_FOLDER"]
    Path(folder, str(os.getpid())).touch()
    deadline = time.monotonic() + 10
    while len(os.listdir(folder)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    return float(os.getpid())
"""


def test_workers_start_as_slow_calls_need_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Up to ``VFOPS_SCORING_WORKERS`` workers, another started only when the calls find
    them busy and one call (not a worker's first: its warm-up) kept its worker busy
    >= 20 ms (or a call waited past ``_GROW_AFTER_S``, here longer than the test): cheap
    concurrent calls share one worker, a slow first call notwithstanding; after a warm
    50 ms call, three calls that each wait for the two others get three; with no wait
    allowed at all they get three as well. The one worker is the forked zygote itself
    (one process, not a zygote beside it); the others come from a spawned zygote, which
    imports the functions by name (a test module does not import there: pytest's
    importlib mode)."""
    import importlib

    from vfops.rubrics import _workers

    (tmp_path / "growth_rewards.py").write_text(GROWTH_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = importlib.import_module("growth_rewards")
    pid_of, meet = rewards.pid_of, rewards.meet

    monkeypatch.setenv("VFOPS_SCORING_WORKERS", "3")
    monkeypatch.setattr(_workers, "_GROW_AFTER_S", 300.0)
    pids, zygote = asyncio.run(_pids_of(Rubric([pid_of]), groups=6, size=4, first=[[state(9)]]))
    assert pids == {zygote} and zygote != os.getpid()

    for grow_after, first in ((300.0, [[state(9)], [state(9)]]), (0.0, [])):
        monkeypatch.setattr(_workers, "_GROW_AFTER_S", grow_after)
        folder = tmp_path / f"met-{grow_after}"
        folder.mkdir()
        monkeypatch.setenv("MEET_FOLDER", str(folder))  # before the workers are forked
        pids, zygote = asyncio.run(_pids_of(Rubric([meet]), groups=3, size=1, first=first))
        assert len(os.listdir(folder)) == 3 and len(pids) == 3, (grow_after, pids)
        assert zygote in pids and os.getpid() not in pids  # none of them in-process


SPAWNED_SCRIPT = """
import asyncio, json, os, sys, threading

from skipping_rewards import other
from spawn_rewards import exact, hog_once
from vfops.rubrics import Rubric
from vfops.rubrics._workers import start_scoring_workers

spawned = []
spawn = os.posix_spawn


def recorded(*args, **kwargs):
    spawned.append(spawn(*args, **kwargs))
    return spawned[-1]


os.posix_spawn = recorded
stale = Rubric([other])  # another evaluation's, whose module will not import there
rubric = Rubric([exact, hog_once, lambda answer: 0.25], weights=[1.0, 1.0, 1.0])
state = lambda i: {"prompt": [], "completion": [{"role": "assistant", "content": "4"}],
                   "answer": "4", "info": {}, "task": "t", "example_id": 0, "rollout_index": i}
release = threading.Event()
other = threading.Thread(target=release.wait)
other.start()


async def main():
    workers = start_scoring_workers()
    assert workers is not None
    try:
        scores = await rubric.score_group([state(i) for i in range(3)])
        return scores, workers.zygote
    finally:
        await workers.aclose()


try:
    scores, zygote = asyncio.run(main())
finally:
    release.set()
    other.join()
print(json.dumps({
    "spawned": zygote in spawned,
    "rewards": [s.reward for s in scores],
    "errors": [None if s.error is None else [s.error.type, s.error.message] for s in scores],
}))
"""

SPAWN_REWARDS = """
def exact(completion, answer):
    return 1.0 if completion[-1]["content"] == answer else 0.0


def hog_once(rollout_index):
    if rollout_index == 0:  # 2 GB
        return float(len(bytearray(2 << 30)))
    return 0.5
"""


SKIPPING_REWARDS = """
import sys

if sys.argv[:1] == ["-c"]:  # imported in the spawned zygote: as a test module skipping itself
    raise SystemExit("not here")


def other(answer):
    return 0.0
"""


def test_with_another_thread_running_the_zygote_is_spawned_and_contains(tmp_path: Path) -> None:
    """A fork copies the locks other threads hold (a flow's engine, a sweep's cells):
    in a process where another thread runs, the zygote is a fresh interpreter
    (``posix_spawn``), not a fork of that process, sent the functions by name (a module's)
    or by value (a lambda); a reward past the limit there errors its rollout. Another
    rubric whose module raises a BaseException on import there does not take it down.
    Run in a process of its own, as a flow's is."""
    (tmp_path / "spawn_rewards.py").write_text(SPAWN_REWARDS)
    (tmp_path / "skipping_rewards.py").write_text(SKIPPING_REWARDS)
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED_SCRIPT)
    env = {**os.environ, "VFOPS_SCORING_MEMORY_MB": str(LIMIT_MB), "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    found = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert found["spawned"], found  # not a fork of that process
    error = found["errors"][0]
    assert found["rewards"][0] is None and error is not None, found
    assert error[0] == "ScoringMemoryLimit" and "'hog_once'" in error[1], error
    assert found["rewards"][1:] == [1.75, 1.75], found


def test_in_a_worker_memory_is_limited_and_the_eval_process_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """numpy, list growth and bytearray past the limit each error their rollout; a
    crash (abort) of the worker errors its call and a fresh worker scores the rest;
    the limit is the worker's: this process still allocates freely."""
    import numpy as np

    monkeypatch.setenv("VFOPS_SCORING_MEMORY_MB", str(LIMIT_MB))
    test_process = os.getpid()

    def hog(rollout_index: int) -> float:
        if rollout_index == 0:
            return float(np.ones(HOG_BYTES // 8).sum())
        if rollout_index == 1:  # 1 KiB at a time, up to 2 GB
            grown = [bytearray(1024) for _ in range(HOG_BYTES // 1024)]
            return float(len(grown))
        if rollout_index == 2:
            return float(len(bytearray(HOG_BYTES)))
        if rollout_index == 3 and os.getpid() != test_process:  # never the test's own
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
        return 0.5

    rubric = Rubric([exact, hog])
    scores, workers = asyncio.run(with_workers(rubric, [state(i) for i in range(5)]))
    for score in scores[:3]:
        assert score.reward is None and score.error is not None
        assert score.error.type == "ScoringMemoryLimit"
        assert f"{LIMIT_MB} MiB" in score.error.message
    died = scores[3].error
    assert (
        died is not None
        and died.type == "ScoringWorkerDied"
        and "VFOPS_SCORING_MEMORY_MB" in died.message
    )
    assert scores[4].reward == 1.5 and scores[4].error is None
    assert workers.limit_mb == LIMIT_MB
    assert len(bytearray(LIMIT_MB * 2 << 20)) == LIMIT_MB * 2 << 20  # not limited here


def test_the_eval_process_is_limited_only_while_a_reward_scores_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside an async reward the process's soft ``RLIMIT_DATA`` is its written memory
    plus the allowance; before and after scoring it is what it was (a model or a dataset
    loaded here is never refused by it)."""
    import resource

    monkeypatch.setenv("VFOPS_SCORING_MEMORY_MB", str(LIMIT_MB))
    before = resource.getrlimit(resource.RLIMIT_DATA)
    seen: list[tuple[int, int]] = []
    refused: list[bool] = []

    async def watches(rollout_index: int) -> float:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        seen.append((soft, hard))
        await asyncio.sleep(0)
        try:
            bytearray(soft)  # the whole limit at once: past it, whatever is written
        except MemoryError:
            refused.append(True)
        return 1.0

    scores = asyncio.run(Rubric([watches]).score_group([state(i) for i in range(3)]))
    assert [score.reward for score in scores] == [1.0] * 3
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert len(seen) == 3 and refused == [True] * 3
    for soft, hard in seen:
        assert hard == before[1] and soft != resource.RLIM_INFINITY
        assert soft > LIMIT_MB << 20
    assert len(bytearray(LIMIT_MB * 2 << 20)) == LIMIT_MB * 2 << 20  # lifted


def test_the_limit_is_measured_from_what_the_process_holds_when_scoring_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Memory the process took between two scorings (a model loaded, 4x the allowance
    here) raises the next scoring's base with it: a base kept from before would put the
    limit under what the process holds and refuse every allocation."""
    monkeypatch.setenv("VFOPS_SCORING_MEMORY_MB", "64")

    async def small(rollout_index: int) -> float:
        return float(len(bytearray(1 << 20)) > 0)  # 1 MiB: well inside the allowance

    rubric = Rubric([small])
    first = asyncio.run(rubric.score_group([state(0)]))
    held = bytearray(256 << 20)  # between the scorings, outside any limit
    second = asyncio.run(rubric.score_group([state(1)]))
    assert len(held) == 256 << 20
    assert [s.reward for s in first + second] == [1.0, 1.0], [s.error for s in first + second]


def test_a_call_past_the_time_limit_ends_its_worker_and_what_it_started(
    marker: str,
) -> None:
    """A sync reward that starts a child and hangs: its rollout times out, and its
    worker is killed with the child (a thread could only be abandoned)."""

    def hangs(completion: list[dict[str, str]]) -> float:
        subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 1000"])
        while not marked(marker):  # started: then hang for ever
            time.sleep(0.01)
        time.sleep(1000)
        return 1.0

    rubric = Rubric([exact, hangs], scoring_timeout_s=1.0)
    scores, _ = asyncio.run(with_workers(rubric, [state(0)]))
    error = scores[0].error
    assert error is not None and error.type == "ScoringTimeout"
    assert wait_until_none(marker) == []


KILLED_EVAL = """
import asyncio, os, subprocess, sys, time
from vfops.rubrics import RolloutScore, Rubric
from vfops.rubrics._workers import start_scoring_workers

marker = os.environ["CONTAINED_TEST_MARKER"]

def hangs(completion) -> float:
    subprocess.Popen(["bash", "-c", f"exec -a {marker} sleep 1000"])
    subprocess.Popen(["sh", "-c", f"setsid bash -c 'exec -a {marker} sleep 1000' &"])
    time.sleep(1000)
    return 1.0

async def main():
    rubric = Rubric([hangs], scoring_timeout_s=0)
    workers = start_scoring_workers()
    state = {"prompt": [], "completion": [], "answer": "", "info": {}, "task": "t",
             "example_id": 0, "rollout_index": 0}
    await rubric.score_group([state])

asyncio.run(main())
"""


def test_kill_9_of_the_eval_ends_its_workers_and_what_their_rewards_started(
    tmp_path: Path, marker: str
) -> None:
    """The eval process is killed (SIGKILL: nothing of it runs) while a reward that
    started a child and a setsid daemon hangs: both end, with the workers."""
    script = tmp_path / "killed_eval.py"
    script.write_text(textwrap.dedent(KILLED_EVAL))
    env = {**os.environ, "CONTAINED_TEST_MARKER": marker}
    process = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        deadline = time.monotonic() + 60  # a safety net: it returns on the state
        while len(marked(marker, named=True)) < 2 and time.monotonic() < deadline:
            assert process.poll() is None
            time.sleep(0.02)
        assert len(marked(marker, named=True)) == 2, "the reward never started its children"
    finally:
        process.kill()
        process.wait()
    assert wait_until_none(marker) == []


def resident_mb() -> float:
    """This process's resident memory (VmRSS), MB."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if "VmRSS" in line) / 1024


ROWS_EVAL = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    import orjson
    from vfops.envs import SingleTurnEnv
    from vfops.evaluation import EvalRequest, ModelOptions, RunOptions, evaluate_async, iter_records
    from vfops.rubrics import Rubric

    def resident_mb():
        status = Path("/proc/self/status").read_text()
        return next(int(l.split()[1]) for l in status.splitlines() if "VmRSS" in l) / 1024

    def build():  # distinct 4 KiB questions: malloc'd, not shared
        return [{"question": f"{i:08d}" + "?" * 4088, "answer": "4"} for i in range(15_360)]

    def resident(completion):
        return resident_mb()  # as the reward: where it runs (the worker)

    env = SingleTurnEnv(eval_dataset=build, rubric=Rubric([resident]))
    assert env.eval_size() == 15_360  # built here, as an eval builds them before the fork
    with_rows = resident_mb()
    request = EvalRequest(env_name="rows", model="stub-model", num_examples=1,
                          rollouts_per_example=1, max_concurrent=1)
    options = RunOptions(output_root=Path(sys.argv[2]), registry=False, tracking=False)
    result = asyncio.run(evaluate_async(
        request, options, model_options=ModelOptions(base_url=sys.argv[1]), environment=env))
    assert result.status == "completed", result.error
    assert env.eval_size() == 15_360  # the eval's own rows are untouched
    (record,) = iter_records(result.run_dir)
    got = {"worker": record.reward, "eval": with_rows, "error": str(record.error)}
    print(orjson.dumps(got).decode())
    """
)


def test_the_workers_are_forked_without_the_environments_rows(tmp_path: Path) -> None:
    """The zygote drops the rows the eval built (~60 MB here) before it forks a worker:
    the worker's RSS is far below the eval's, though it is the eval's copy. Without the
    drop the worker maps every page of them (a forked process's RSS counts them). The
    eval runs in a process of its own: workers are forked only where no other thread
    runs (this test's process has the stub's)."""
    rows_mb = 60
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        done = subprocess.run(
            [sys.executable, "-c", ROWS_EVAL, stub.base_url, str(tmp_path)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert got["worker"] is not None, got["error"]
    assert got["worker"] < got["eval"] - 0.75 * rows_mb, got


def test_dropping_the_built_rows_reaches_every_member_of_a_group() -> None:
    """What the zygote calls: an EnvGroup forgets its own rows and its members' (each
    split is built again, from its source, on next use)."""
    builds: list[str] = []

    def member(name: str) -> SingleTurnEnv:
        def rows() -> list[dict[str, str]]:
            builds.append(name)
            return [{"question": f"{name}?", "answer": "4"}]

        return SingleTurnEnv(eval_dataset=rows, rubric=Rubric([exact]), name=name)

    group = EnvGroup([member("a"), member("b")])
    assert group.eval_size() == 2 and sorted(builds) == ["a", "b"]
    group.drop_built_rows()
    assert group.eval_size() == 2 and sorted(builds) == ["a", "a", "b", "b"]


def test_scoring_worker_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VFOPS_SCORING_WORKERS", "two")
    with pytest.raises(InvalidArgumentError, match="VFOPS_SCORING_WORKERS must be"):
        scoring_workers()
    monkeypatch.setenv("VFOPS_SCORING_WORKERS", "0")  # in-process, as before
    Rubric([exact])
    assert start_scoring_workers() is None
