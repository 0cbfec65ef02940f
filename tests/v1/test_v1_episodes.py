"""Episodes of several traces under vfops: a two-agent ``Env`` (``v1_duel``: two seats
through interactions, zero-sum chips recorded in ``run()``) recorded as verifiers records
it, one rollout per seat per episode, read back together, resumed by whole episodes, and
trained on per seat; an infinite taskset (``v1_endless``) runs its first N tasks.

Run in .venv-v1 (``make test-v1``).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.v1.scripted_endpoint import reply
from vfops.envs import load_environment
from vfops.testing import StubConfig, StubServer

VFOPS = str(Path(sys.executable).parent / "vfops")
SEATS = {"opener", "responder"}


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode=reply)) as server:
        yield server


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_TRACKING": "0",
            "COLUMNS": "120"}  # fmt: skip


def vfops(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VFOPS, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


def evaluate(
    taskset: str, stub: StubServer, env: dict[str, str], cwd: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return vfops(
        ["eval", taskset, "-m", "stub-model", "-b", stub.base_url, "-o", str(cwd / "out"), *extra],
        env, cwd,
    )  # fmt: skip


def rows(cwd: Path) -> list[dict]:
    (results,) = (cwd / "out").rglob("results.jsonl")
    return [orjson.loads(line) for line in results.read_bytes().splitlines()]


def test_each_seat_of_an_episode_is_a_rollout_read_back_together(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    done = evaluate("v1_duel", stub, home, tmp_path, "-n", "3", "-r", "2")
    assert done.returncode == 0, done.stderr + done.stdout
    found = rows(tmp_path)
    assert "note:" not in done.stdout  # both seats pin verifiers' chat harness (null)
    # 3 hands x 2 episodes x 2 seats, each seat's trace its own rollout
    assert len(found) == 12
    episodes: dict[tuple[int, int], list[dict]] = {}
    for row in found:
        assert row["rollout_index"] == row["episode"] * 1000 + (row["rollout_index"] % 1000)
        episodes.setdefault((row["example_id"], row["episode"]), []).append(row)
    assert sorted(episodes) == [(e, r) for e in range(3) for r in range(2)]
    for traces in episodes.values():
        assert {t["agent"] for t in traces} == SEATS
        # the seats' chips are zero-sum, as run() recorded them on each trace
        assert sum(t["metrics"]["chips"] for t in traces) == 0
        assert all(t["reward"] == t["metrics"]["chips"] for t in traces)
    # per seat in the run's summary
    assert re.search(r"opener\s+reward", done.stdout) and re.search(
        r"responder\s+reward", done.stdout
    ), done.stdout

    run_id = re.search(r"run: ([0-9a-f]{32})", done.stdout).group(1)  # type: ignore[union-attr]
    shown = vfops(["runs", "show", run_id, "--rollout", "0"], home, tmp_path)
    assert shown.returncode == 0, shown.stderr
    headers = re.findall(r"== example 0, episode 0, agent (\w+)", shown.stdout)
    assert sorted(headers) == sorted(SEATS), shown.stdout  # the episode's two traces


def test_an_infinite_taskset_runs_its_first_n_tasks(
    stub: StubServer, home: dict[str, str], tmp_path: Path
) -> None:
    done = evaluate("v1_endless", stub, home, tmp_path, "-n", "4", "-r", "1")
    assert done.returncode == 0, done.stderr + done.stdout
    assert sorted(row["example_id"] for row in rows(tmp_path)) == [0, 1, 2, 3]
    # its role is unpinned: vf-eval would run its default coding-agent harness, vfops the
    # chat loop, and says so (in the summary and the run's metadata)
    (note,) = [line for line in done.stdout.splitlines() if line.startswith("note:")]
    assert "'bash' harness" in note and "--env.agent.harness.id null" in note, note
    (metadata,) = (tmp_path / "out").rglob("metadata.json")
    assert orjson.loads(metadata.read_bytes())["notes"] == [note.removeprefix("note: ")]

    every = evaluate("v1_endless", stub, home, tmp_path, "-n", "-1")
    assert every.returncode == 2, every.stdout + every.stderr
    (line,) = every.stderr.strip().splitlines()
    assert "infinite" in line and "-n N" in line


def test_resume_runs_the_missing_episodes_whole(stub: StubServer) -> None:
    """The runner maps a stored rollout index of an episode of several traces back to its
    episode: with both seats of example 0's episode 0 recorded, a resumed run plays only
    episode 1 (both seats), never episode 0 again nor a seat of it alone."""
    from vfops._rollout import EPISODE_TRACE_SLOTS
    from vfops.clients import OpenAIClient
    from vfops.evaluation import EvalRequest
    from vfops.evaluation._runner import run_rollouts

    env = load_environment("v1_duel")
    assert env.episode_of(2 * EPISODE_TRACE_SLOTS + 1) == 2
    assert load_environment("v1_arith").episode_of(2001) == 2001  # one trace: itself
    request = EvalRequest(env_name="v1_duel", model="stub-model", num_examples=1,
                          rollouts_per_example=2)  # fmt: skip
    env.eval_size(request.num_examples)
    done = {(0, 0), (0, 1)}  # episode 0's two seats (rollout indices 0 and 1)
    handled: list[Any] = []

    async def handle(records: list[Any]) -> None:
        handled.extend(records)

    async def resume() -> None:
        async with OpenAIClient(stub.base_url, api_key="k") as client:
            try:
                await run_rollouts(env, client, request, done, handle)
            finally:
                await env.aclose()

    asyncio.run(resume())
    assert sorted((r.episode, r.agent) for r in handled) == [(1, "opener"), (1, "responder")]
    assert {r.rollout_index for r in handled} == {EPISODE_TRACE_SLOTS, EPISODE_TRACE_SLOTS + 1}


@pytest.mark.train
def test_each_seats_turns_are_its_own_tokens(tmp_path: Path) -> None:
    """Through the trainer's ``hf`` backend: each seat's rollout carries the token ids of
    its own turns (the interception keys model calls by trace), so a seat trains on what
    it saw and said, and a step's batch gives each seat its own baseline."""
    import transformers

    from vfops.local import build_tiny_model
    from vfops.training import TOKENS_KEY, HFBackend
    from vfops.training._batch import to_batch
    from vfops.training._config import LossConfig

    tiny = build_tiny_model(tmp_path / "model", seed=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny))
    backend = HFBackend(model, tokenizer)
    env = load_environment("v1_duel")
    example = next(iter(env.iter_eval_examples(1)))

    async def run() -> tuple[list[dict], list]:
        try:
            return await env.run_group_states(
                backend.client, "m", example, range(3), sampling_args={"max_tokens": 8, "seed": 1}
            )
        finally:
            await env.aclose()

    states, scores = asyncio.run(run())
    assert Counter(s["agent"] for s in states) == {"opener": 3, "responder": 3}
    # the opener always acts; the responder only when the opener made a legal move (a
    # random model rarely does: its seat forfeits), so a responder may have no call
    assert all(s["responses"] for s in states if s["agent"] == "opener")
    for state in states:
        for response in state["responses"]:
            prompt = tokenizer.decode(response.raw[TOKENS_KEY]["prompt_ids"])
            assert f"You are the {state['agent']}" in prompt
    batch = to_batch(0, [(states, scores)], 0.1, LossConfig(scale_rewards=False))
    assert batch.rollouts == sum(1 for s in scores if s.reward is not None)


def test_an_infinite_taskset_publishes_its_first_tasks(
    home: dict[str, str], tmp_path: Path
) -> None:
    from vfops.publishing._build import SNAPSHOT_ROWS

    folder = Path(__file__).resolve().parents[1] / "verifiers_v1_envs" / "v1_endless"
    done = vfops(["env", "publish", str(folder)], home, tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"train: {SNAPSHOT_ROWS} rows, eval: {SNAPSHOT_ROWS} rows" in done.stdout, done.stdout


def test_killed_and_resumed_every_episode_is_whole(tmp_path: Path) -> None:
    """``kill -9`` of the whole process tree once some episodes are recorded, then
    ``--resume``: every episode has both seats' traces exactly once, in the folder and
    in the registry (an example's episodes are written as one group: never half)."""
    import signal
    import time

    home = {**os.environ, "VFOPS_HOME": str(tmp_path / "home"), "VFOPS_TRACKING": "0"}
    with StubServer(StubConfig(reply_mode=reply, latency_ms=150)) as slow:
        args = ["eval", "v1_duel", "-m", "stub-model", "-b", slow.base_url, "-n", "4", "-r",
                "2", "-c", "2", "-o", str(tmp_path / "out")]  # fmt: skip
        first = subprocess.Popen(
            [VFOPS, *args], env=home, cwd=tmp_path, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while not any(p.stat().st_size for p in (tmp_path / "out").rglob("results.jsonl")):
            assert first.poll() is None, "the run ended before any episode was recorded"
            assert time.monotonic() < deadline
            time.sleep(0.05)  # polling the folder's state, not a guessed wait
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        (results,) = (tmp_path / "out").rglob("results.jsonl")
        partial = len(results.read_bytes().splitlines())
        assert 0 < partial < 16  # 4 hands x 2 episodes x 2 seats in all
        resumed = vfops([*args, "--resume", str(results.parent)], home, tmp_path)
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    found = rows(tmp_path)
    seats = sorted((r["example_id"], r["episode"], r["agent"]) for r in found)
    expected = sorted(
        (e, p, a) for e in range(4) for p in range(2) for a in ("opener", "responder")
    )
    assert seats == expected  # the folder: each seat of each episode once
    run_id = re.search(r"run: ([0-9a-f]{32})", resumed.stdout).group(1)  # type: ignore[union-attr]
    shown = vfops(["runs", "show", run_id, "--limit", "100"], home, tmp_path)
    previews = re.findall(r"^example (\d+) episode (\d+) (\w+) #", shown.stdout, re.M)
    assert sorted((int(e), int(p), a) for e, p, a in previews) == expected  # the registry
