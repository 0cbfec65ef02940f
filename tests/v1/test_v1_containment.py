"""The rewards of a ``verifiers`` v1 taskset are contained too (issue 44, deliverable
10): its ``@vf.reward``/``@vf.metric`` functions run in vfops's scoring workers, so one
that allocates 2 GB under a 512 MiB limit makes its own rollout a scoring error naming
the limit and the eval completes; the other rollouts score what verifiers gives them,
and a raising reward is the scoring error verifiers makes of it.

Run in .venv-v1 (``make test-v1``). The taskset is a module written here, found on
``PYTHONPATH`` by its name as ``vf-eval`` finds one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from vfops.testing import StubConfig, StubServer

pytest.importorskip("verifiers.v1", reason="verifiers 0.4 is in .venv-v1 only")

LIMIT_MB = 512
VFOPS = str(Path(sys.executable).parent / "vfops")

V1_CONTAINED = """
import os
from pathlib import Path

import verifiers.v1 as vf

PIDS = Path(os.environ["V1_CONTAINED_PIDS"])


class HogData(vf.TaskData):
    answer: str


class HogTask(vf.Task[HogData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        with PIDS.open("a") as file:  # which process ran the reward
            file.write(f"{os.getpid()}\\n")
        return float(self.data.answer in (trace.last_reply or ""))

    @vf.reward(weight=0.5)
    async def greedy(self, trace: vf.Trace) -> float:
        if self.data.answer == "1":
            try:  # the first call of this task's two, whichever process runs it: 2 GB
                os.close(os.open(PIDS.with_name("greedy"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return 1.0
            buffer = bytearray(2 << 30)
            return float(len(buffer))
        if self.data.answer == "2":
            raise ValueError("cannot judge two")
        return 1.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))

    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1


class HogTaskset(vf.Taskset[HogTask, vf.TasksetConfig]):
    def load(self):
        for i in range(4):
            data = HogData(prompt=f"Say {i}. ANSWER_HINT: {i}", answer=str(i))
            yield HogTask(data, self.config.task)


__all__ = ["HogTaskset"]
"""


@pytest.mark.parametrize("workers", [None, "0"], ids=["in-workers", "in-process"])
def test_a_v1_reward_past_the_memory_limit_errors_its_rollout_and_the_eval_completes(
    tmp_path: Path, workers: str | None
) -> None:
    """Four tasks x two rollouts: task 1's first ``greedy`` call allocates 2 GB (a
    ScoringMemoryLimit scoring error, never scored), task 2's ``greedy`` raises (both its
    rollouts the scoring error verifiers makes of it), the four others score 1.5; exit
    0, ``completed``, and the rewards ran in processes other than the eval's. Without
    workers they run in the eval's process under the same allowance, with the same
    outcome."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "v1_contained.py").write_text(V1_CONTAINED)
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_TRACKING": "0",
        "VFOPS_SCORING_MEMORY_MB": str(LIMIT_MB),
        "V1_CONTAINED_PIDS": str(pids),
    }
    env.pop("VFOPS_DATABASE_URL", None)
    env.pop("VFOPS_SCORING_WORKERS", None)
    if workers is not None:
        env["VFOPS_SCORING_WORKERS"] = workers
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "v1_contained", "-m", "stub-model", "-b", stub.base_url, "-n", "4",
                "-r", "2", "-o", str(tmp_path / "out"), "--max-error-rate", "0.5"]  # fmt: skip
        process = subprocess.Popen(
            [VFOPS, *args], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        out, err = process.communicate(timeout=300)  # a safety net
    assert process.returncode == 0, out + err
    (run_dir,) = (tmp_path / "out").glob("evals/*/*")
    assert orjson.loads((run_dir / "metadata.json").read_bytes())["status"] == "completed"
    rows = [orjson.loads(line) for line in (run_dir / "results.jsonl").read_bytes().splitlines()]
    assert len(rows) == 8
    by_answer: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        by_answer.setdefault(str(row["answer"]), []).append(row)
    hog = [row for row in by_answer["1"] if row["error"] is not None]
    assert len(hog) == 1, by_answer["1"]
    error = hog[0]["error"]
    assert isinstance(error, dict)
    assert error["type"] == "ScoringMemoryLimit" and error["stage"] == "scoring", error
    assert f"{LIMIT_MB} MiB" in error["message"] and "'greedy'" in error["message"], error
    assert hog[0]["reward"] is None
    raised = by_answer["2"]
    assert all(row["error"] is not None and row["reward"] is None for row in raised), raised
    assert all("ValueError: cannot judge two" in row["error"]["message"] for row in raised)  # type: ignore[index]
    scored = [row for row in rows if row["error"] is None]
    assert len(scored) == 5 and {row["reward"] for row in scored} == {1.5}, scored
    ran_in = {int(line) for line in pids.read_text().split()}
    assert ran_in == {process.pid} if workers == "0" else ran_in and process.pid not in ran_in
