"""The rewards of a classic ``verifiers`` environment are contained too (issue 44,
deliverable 10): its sync reward functions run in vfops's scoring workers, so one that
allocates 2 GB under a 512 MiB limit errors its own rollout and the eval completes,
while every other number is the one ``verifiers`` gives (a raising reward is 0.0, as
``verifiers`` logs and scores it; async rewards and group rewards as ``verifiers``
calls them).

The environment is written here, in a temporary site folder holding its module and a
dist-info that requires ``verifiers`` (how vfops finds a ``verifiers`` package).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from vfops.evaluation import (
    EvalRequest,
    ModelOptions,
    RunOptions,
    evaluate_async,
    iter_records,
)
from vfops.testing import StubConfig, StubServer

pytest.importorskip("verifiers.legacy", reason="the classic verifiers line is in .venv only")

LIMIT_MB = 512

VF_CONTAINED = """
import asyncio
import os
from pathlib import Path

import verifiers as vf
from datasets import Dataset

PIDS = Path(os.environ["VF_CONTAINED_PIDS"])


def correct(parser, completion, answer, **kwargs) -> float:
    with PIDS.open("a") as file:  # which process ran the reward
        file.write(f"{os.getpid()}\\n")
    return 1.0 if answer in (parser.parse_answer(completion) or "") else 0.0


def greedy(completion, answer, state) -> float:
    if answer == "1" and state["info"]["greedy"]:
        try:  # the first call of this example's two, whichever process runs it: 2 GB
            os.close(os.open(PIDS.with_name("greedy"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return 0.5
        buffer = bytearray(2 << 30)
        return float(len(buffer))
    return 0.5


def raises(answer) -> float:
    raise ValueError("not a number")  # verifiers: logged, scored 0.0


def group_share(completions, answers) -> list[float]:
    return [0.25 for _ in completions]


async def judged(completion, answer) -> float:
    await asyncio.sleep(0)
    return 1.0


def load_environment() -> vf.Environment:
    rows = [
        {"question": f"Say {i}. ANSWER_HINT: {i}", "answer": str(i), "info": {"greedy": True}}
        for i in range(3)
    ]
    rubric = vf.Rubric(
        funcs=[correct, greedy, raises, group_share, judged], weights=[1.0, 1.0, 1.0, 1.0, 0.0]
    )
    return vf.SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=rubric)
"""


@pytest.fixture(scope="module")
def vf_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("vf_contained_site")
    (site / "vf_contained.py").write_text(VF_CONTAINED)
    info = site / "vf_contained-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vf-contained\nVersion: 0.1.0\n"
        "Requires-Dist: verifiers>=0.3.1,<0.4\n"
    )
    (info / "top_level.txt").write_text("vf_contained\n")
    (info / "RECORD").write_text("vf_contained.py,,\n")
    return site


@pytest.mark.parametrize("workers", [None, "0"], ids=["in-workers", "in-process"])
def test_a_verifiers_reward_past_the_memory_limit_errors_its_rollout_the_rest_as_verifiers(
    vf_site: Path, tmp_path: Path, workers: str | None
) -> None:
    """Three examples x two rollouts; one rollout's ``greedy`` allocates 2 GB: that rollout
    is a ScoringMemoryLimit error (never scored), the five others score what verifiers
    gives them (1 + 0.5 + 0 + 0.25 = 1.75: ``raises`` is 0.0 as verifiers has it), the
    eval exits 0, and the sync rewards ran in processes other than the eval's. Without
    workers they run in the eval's process, under the same allowance: verifiers' own
    call turns the ``MemoryError`` into 0.0, and vfops makes it the rollout's error."""
    pids = tmp_path / "pids"
    env = {
        **os.environ,
        "PYTHONPATH": str(vf_site),
        "VFOPS_HOME": str(tmp_path / "home"),
        "VFOPS_TRACKING": "0",
        "VFOPS_SCORING_MEMORY_MB": str(LIMIT_MB),
        "VF_CONTAINED_PIDS": str(pids),
    }
    env.pop("VFOPS_DATABASE_URL", None)
    env.pop("VFOPS_SCORING_WORKERS", None)
    if workers is not None:
        env["VFOPS_SCORING_WORKERS"] = workers
    with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
        args = ["eval", "vf_contained", "-m", "stub-model", "-b", stub.base_url, "-n", "3",
                "-r", "2", "-o", str(tmp_path / "out"), "--max-error-rate", "0.25"]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "vfops", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _, err = process.communicate(timeout=240)  # a safety net
    assert process.returncode == 0, err
    (run_dir,) = (tmp_path / "out").glob("evals/*/*")
    assert orjson.loads((run_dir / "metadata.json").read_bytes())["status"] == "completed"
    rows = [orjson.loads(line) for line in (run_dir / "results.jsonl").read_bytes().splitlines()]
    assert len(rows) == 6
    errored = [row for row in rows if row["error"] is not None]
    assert len(errored) == 1, errored
    (error_row,) = errored
    assert error_row["answer"] == "1" and error_row["reward"] is None
    error = error_row["error"]
    assert error["type"] == "ScoringMemoryLimit" and error["stage"] == "scoring", error
    assert f"{LIMIT_MB} MiB" in error["message"] and "'greedy'" in error["message"]
    scored = [row for row in rows if row["error"] is None]
    assert [row["reward"] for row in scored] == [1.75] * 5, scored
    assert all(row["metrics"]["raises"] == 0.0 for row in scored)
    assert all(row["metrics"]["judged"] == 1.0 for row in scored)
    ran_in = {int(line) for line in pids.read_text().split()}
    assert ran_in == {process.pid} if workers == "0" else ran_in and process.pid not in ran_in


def test_verifiers_rewards_score_the_same_with_and_without_workers(
    vf_site: Path, tmp_path: Path
) -> None:
    """The same environment, its 2 GB rollout aside (a larger limit is not needed: the
    example is not evaluated), scored in workers and in-process
    (``VFOPS_SCORING_WORKERS=0``): the same rewards and metrics, row for row."""
    results: dict[str, list[tuple[str, int, float, dict[str, float]]]] = {}
    for workers in ("2", "0"):
        env = {
            **os.environ,
            "PYTHONPATH": str(vf_site),
            "VFOPS_HOME": str(tmp_path / f"home{workers}"),
            "VFOPS_TRACKING": "0",
            "VFOPS_SCORING_WORKERS": workers,
            "VF_CONTAINED_PIDS": str(tmp_path / f"pids{workers}"),
        }
        env.pop("VFOPS_DATABASE_URL", None)
        out = tmp_path / f"out{workers}"
        with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
            args = ["eval", "vf_contained", "-m", "stub-model", "-b", stub.base_url, "-n", "1",
                    "-r", "3", "-o", str(out)]  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "vfops", *args], env=env, capture_output=True, text=True,
                timeout=240,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (run_dir,) = out.glob("evals/*/*")
        rows = [orjson.loads(x) for x in (run_dir / "results.jsonl").read_bytes().splitlines()]
        results[workers] = sorted(
            (row["answer"], row["rollout_index"], row["reward"], row["metrics"]) for row in rows
        )
    assert results["2"] == results["0"]
    assert [reward for _, _, reward, _ in results["0"]] == [1.75] * 3


def test_in_a_process_with_threads_a_verifiers_reward_is_contained_by_a_spawned_zygote(
    vf_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eval run in-process where another thread runs (a flow's engine, a notebook):
    the zygote is spawned and sent the rewards by name, so the 2 GB reward still errors
    only its rollout and the eval completes, in this process."""
    monkeypatch.syspath_prepend(str(vf_site))
    monkeypatch.setenv("VFOPS_SCORING_MEMORY_MB", str(LIMIT_MB))
    monkeypatch.setenv("VF_CONTAINED_PIDS", str(tmp_path / "pids"))
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        with StubServer(StubConfig(reply_mode="echo_answer")) as stub:
            request = EvalRequest(
                env_name="vf_contained", model="stub-model", base_url=stub.base_url,
                num_examples=3, rollouts_per_example=2,
            )  # fmt: skip
            result = asyncio.run(
                evaluate_async(
                    request, RunOptions(output_root=tmp_path, registry=False, tracking=False),
                    model_options=ModelOptions(base_url=stub.base_url),
                )
            )  # fmt: skip
    finally:
        release.set()
        other.join()
    assert result.status == "completed", result.error
    assert result.run_dir is not None
    records = list(iter_records(result.run_dir))
    errors = [r.error for r in records if r.error is not None]
    assert [e.type for e in errors] == ["ScoringMemoryLimit"], errors
    assert sorted(r.reward for r in records if r.error is None) == [1.75] * 5
    ran_in = {int(line) for line in (tmp_path / "pids").read_text().split()}
    assert ran_in and os.getpid() not in ran_in, ran_in
