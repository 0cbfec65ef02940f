"""``vfops runs show``: a run's settings and ids, and whole transcripts of its rollouts.

A real ``vfops eval`` of the multi-turn ``guess_number`` environment against a stub
model over HTTP (it guesses 50, then one less each turn), recorded in a SQLite
registry; ``runs show`` is then read against the registry's own rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.registry_fixtures import stored_rollouts
from vfops._rollout import RolloutError, RolloutRecord, TokenUsage
from vfops.evaluation import format_transcript
from vfops.registry import RunFilter, dispose_engines, get_engine, list_runs, session_scope
from vfops.testing import StubConfig, StubServer


def _guesses(request: dict[str, Any]) -> dict[str, Any]:
    turns = sum(1 for m in request["messages"] if m["role"] == "assistant")
    return {"content": f"<think>turn {turns}</think><guess>{50 - turns}</guess>"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("show")
    env = {**os.environ, "VFOPS_HOME": str(root / "home"), "VFOPS_TRACKING": "0",
           "COLUMNS": "100", "STUB_KEY": "k"}  # fmt: skip
    env.pop("VFOPS_DATABASE_URL", None)
    with StubServer(StubConfig(reply_mode=_guesses)) as server:
        evaluated = subprocess.run(
            [sys.executable, "-m", "vfops", "eval", "guess_number", "-m", "stub-model",
             "-b", server.base_url, "-k", "STUB_KEY", "-n", "3", "-r", "2", "-o", str(root)],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert evaluated.returncode in (0, 3), evaluated.stderr
    saved = os.environ.get("VFOPS_HOME")
    os.environ["VFOPS_HOME"] = env["VFOPS_HOME"]
    try:
        engine = get_engine()
        with session_scope(engine, write=False) as session:
            (row,) = list_runs(session, RunFilter(env_name="guess_number"))
            run_id = row.id
        records = list(stored_rollouts(engine, run_id))
        yield {"env": env, "run_id": run_id, "records": records}
    finally:
        dispose_engines()
        if saved is None:
            os.environ.pop("VFOPS_HOME", None)
        else:
            os.environ["VFOPS_HOME"] = saved


def _show(run: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vfops", "runs", "show", run["run_id"][:10], *args],
        env=run["env"], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _contents(record: RolloutRecord) -> list[str]:
    return [str(m.get("content") or "") for m in [*record.prompt, *record.completion]]


def test_runs_list_is_whole_at_80_columns(run: dict[str, Any]) -> None:
    # what a user copies or compares is never cut short (it was: `bcb368…`, `comple…`)
    listed = subprocess.run(
        [sys.executable, "-m", "vfops", "runs", "list"],
        env={**run["env"], "COLUMNS": "80"}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), listed.stdout
    assert "…" not in listed.stdout, listed.stdout
    (at,) = [i for i, line in enumerate(lines) if line.startswith(run["run_id"][:12])]
    row = lines[at]
    engine = get_engine()
    with session_scope(engine, write=False) as session:
        (stored,) = list_runs(session, RunFilter(env_name="guess_number"))
        version, status = stored.environment_version, stored.status
    # the version is on the row's line or wraps, whole, onto the next
    assert row.split()[1] == "guess_number", row
    assert version in (row + "\n" + lines[at + 1]).split(), listed.stdout
    assert "stub-model" in row and status in row.split() and " 6/6 " in row, row


def test_runs_list_quiet_prints_full_ids_for_a_shell_variable(run: dict[str, Any]) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "vfops", "runs", "list", "--env", "guess_number", "-q"],
        env=run["env"], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == run["run_id"] + "\n"  # RUN=$(vfops runs list -q --limit 1)


def test_rollout_0_prints_every_turn_and_each_score(run: dict[str, Any]) -> None:
    shown = _show(run, "--rollout", "0")
    assert shown.returncode == 0, shown.stderr
    record = run["records"][0]
    assert record.turns >= 2 and len(record.completion) >= 3  # a multi-turn game
    out = shown.stdout
    flat = " ".join(out.split())  # long lines wrap
    for content in _contents(record):
        assert " ".join(content.split()) in flat, content
    roles = [m["role"] for m in [*record.prompt, *record.completion]]
    assert [line for line in out.splitlines() if line.startswith("[")] == [f"[{r}]" for r in roles]
    assert record.metrics and all(f"{name} {value:.4f}" in flat
                                  for name, value in record.metrics.items())  # fmt: skip
    assert f"expected answer: {record.answer!r}" in flat
    usage = record.usage
    assert f"{usage.prompt_tokens} prompt / {usage.completion_tokens} completion" in flat
    assert run["run_id"] in out  # the run's ids head the output
    assert out.count("== example") == 1


def test_example_and_failed_select_transcripts(run: dict[str, Any]) -> None:
    by_example = _show(run, "--example", "1")
    assert by_example.returncode == 0, by_example.stderr
    assert by_example.stdout.count("== example 1, rollout") == 2
    assert "== example 0" not in by_example.stdout

    second = _show(run, "--example", "1", "--rollout", "1")
    assert second.stdout.count("== example 1, rollout 1:") == 1

    failed = [r for r in run["records"] if r.reward is None or r.reward < 1.0]
    shown = _show(run, "--failed", "--limit", "100")
    assert shown.returncode == 0 or not failed
    assert shown.stdout.count("== example") == len(failed)

    missing = _show(run, "--example", "99")
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines()[-1].startswith("error: run ")


def test_tool_calls_and_errors_are_readable() -> None:
    record = RolloutRecord(
        example_id=4,
        rollout_index=1,
        prompt=[{"role": "user", "content": "What is 6 * 7?"}],
        completion=[
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            {"role": "assistant", "content": "<answer>42</answer>"},
        ],
        answer="42",
        reward=None,
        metrics={"correct": 1.0},
        error=RolloutError(type="ScoringError", message="judge timed out", stage="scoring"),
        usage=TokenUsage(prompt_tokens=30, completion_tokens=12),
        turns=2,
    )
    text = format_transcript(record, width=80)
    assert '-> tool call multiply({"a": 6, "b": 7}) [call_1]' in text
    assert "[tool call_1]\n    42" in text
    assert "error: ScoringError: judge timed out" in text
    assert "reward none" in text and "scores: correct 1.0000" in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_an_episode_trace_and_an_image_are_named() -> None:
    pixel = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
        "rkJggg=="
    )
    record = RolloutRecord(
        example_id=2,
        rollout_index=1001,
        episode=1,
        agent="player1",
        prompt=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Which colour is this?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pixel}"}},
                ],
            }
        ],
        completion=[{"role": "assistant", "content": "red"}],
        reward=1.0,
    )
    text = format_transcript(record, width=80)
    assert "== example 2, episode 1, agent player1 (rollout 1001): reward 1.0000" in text
    # the image named by its type and size, never its base64
    assert "Which colour is this?\n    <image image/png, 70 bytes>" in text
    assert pixel not in text


def test_runs_list_shows_a_run_with_every_rollout_failed_as_failed(tmp_path: Any) -> None:
    """Every rollout an error (a 400 from the server, say): the list says how many
    failed and shows no reward, where it showed ``completed 4/4 0.000``."""
    from vfops.registry import NewRun, create_run, finish_run
    from vfops.stats import EvalSummary

    summary = EvalSummary()
    for index in range(4):
        error = RolloutError(type="ProviderError", message="HTTP 400", stage="generation")
        summary.add(RolloutRecord(example_id=index, rollout_index=0, prompt=[], completion=[],
                                  error=error))  # fmt: skip
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    engine = get_engine(url)
    with session_scope(engine) as session:
        run = create_run(session, NewRun(
            environment_name="picture", environment_version="0.1.0",
            environment_content_hash="c" * 64, model="text-only", num_examples=4,
            rollouts_per_example=1, config_fingerprint="fp"))  # fmt: skip
        run_id = run.id
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", summary.to_dict())
    listed = subprocess.run(
        [sys.executable, "-m", "vfops", "runs", "list"],
        env={**os.environ, "VFOPS_DATABASE_URL": url, "COLUMNS": "80"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(run_id[:12])]
    row = lines[at]
    # the status may wrap at 80 columns: "completed, 4" / "errors"
    assert "completed, 4" in row and "errors" in lines[at + 1].split(), listed.stdout
    assert " - " in row and "0.000" not in row, listed.stdout
