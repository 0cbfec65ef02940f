"""``vfops runs compare``: a candidate run against a baseline, each named for what it is.

Two runs of ``arithmetic`` in a real registry (SQLite and PostgreSQL): the base model's,
which fails every example, and a newer one of a trained model, which passes every one.
The README's compare commands, taken from README.md and run by bash as written, must
report the newer run as the candidate with a positive delta (they once passed the newest
run first and printed ``-1.0000 (B - A)``, every row ``pass -> fail``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inprocess_cli import run_vfops
from tests.registry_fixtures import DIALECTS, database_url, make_record
from vfops.registry import (
    NewRun,
    create_run,
    dispose_engines,
    get_engine,
    insert_rollouts,
    session_scope,
)

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES, ROLLOUTS = 8, 2


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def _record_run(db_url: str, model: str, reward: float, started: dt.datetime) -> str:
    """A completed arithmetic run of ``model`` whose every rollout scored ``reward``."""
    with session_scope(get_engine(db_url)) as session:
        run = create_run(
            session,
            NewRun(
                environment_name="arithmetic",
                environment_version="0.1.0",
                environment_content_hash="0" * 64,
                model=model,
                num_examples=EXAMPLES,
                rollouts_per_example=ROLLOUTS,
                config_fingerprint="f" * 64,
                status="completed",
            ),
        )
        run.started_at = started  # the order runs list and --latest go by
        run_id = run.id
        session.flush()
        records = [
            make_record(example, index, reward=reward, model=model)
            for example in range(EXAMPLES)
            for index in range(ROLLOUTS)
        ]
        insert_rollouts(session, run_id, records)
    return run_id


@pytest.fixture
def runs(db_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(the base model's run, the newer trained model's run)."""
    now = dt.datetime.now(dt.UTC)
    base = _record_run(db_url, "tiny-base", 0.0, now - dt.timedelta(minutes=10))
    trained = _record_run(db_url, "tiny-trained", 1.0, now)
    dispose_engines()
    yield base, trained
    dispose_engines()


def _readme_compare_lines() -> list[str]:
    """The README's lines that name the runs and compare them, as written."""
    lines = README.read_text(encoding="utf-8").splitlines()
    wanted = ("RUN=$(vfops runs list", "OLD=$(vfops runs list", "vfops runs compare")
    picked = [line for line in lines if line.startswith(wanted)]
    assert sum(line.startswith("vfops runs compare") for line in picked) >= 1, picked
    return picked


def _says_baseline_then_candidate(line: str, baseline: str, candidate: str) -> bool:
    return bool(
        re.fullmatch(
            rf"baseline {baseline[:12]} \(arithmetic 0\.1\.0, model tiny-base, started .+ UTC\) "
            rf"vs candidate {candidate[:12]} \(arithmetic 0\.1\.0, model tiny-trained, "
            r"started .+ UTC\)",
            line,
        )
    )


def test_readme_idiom_reports_the_newer_better_run_as_an_improvement(
    db_url: str, runs: tuple[str, str], tmp_path: Path
) -> None:
    base, trained = runs
    lines = _readme_compare_lines()
    env = {
        **os.environ,
        "VFOPS_DATABASE_URL": db_url,
        "VFOPS_HOME": str(tmp_path / "home"),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "COLUMNS": "80",
    }
    # one command per script, so each compare's output is read on its own
    names = [line for line in lines if not line.startswith("vfops")]
    compares = [line for line in lines if line.startswith("vfops runs compare")]
    for command in compares:
        done = subprocess.run(
            ["bash", "-e", "-c", "\n".join([*names, command])],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stderr)
        first, second, *_table = done.stdout.splitlines()
        assert _says_baseline_then_candidate(first, base, trained), (command, first)
        assert second == (
            f"{EXAMPLES} shared examples: mean reward delta +1.0000 (candidate - baseline); "
            f"flipped to pass {EXAMPLES}, to fail 0; only in baseline 0, only in candidate 0"
        ), command
        assert "fail -> pass" in done.stdout and "pass -> fail" not in done.stdout
        assert done.stderr == "", command


def test_positional_order_is_baseline_then_candidate(
    db_url: str, runs: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    base, trained = runs
    monkeypatch.setenv("VFOPS_DATABASE_URL", db_url)
    code, err = run_vfops(["runs", "compare", base[:8], trained], monkeypatch)
    out = capsys.readouterr().out
    assert (code, err) == (0, "")
    assert _says_baseline_then_candidate(out.splitlines()[0], base, trained)
    assert "mean reward delta +1.0000 (candidate - baseline)" in out

    # the other way round is a regression, and says so: which is which, and a note
    code, err = run_vfops(["runs", "compare", trained, base], monkeypatch)
    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[0].startswith(
        f"baseline {trained[:12]} (arithmetic 0.1.0, model tiny-trained"
    )
    assert f"vs candidate {base[:12]} (arithmetic 0.1.0, model tiny-base" in out.splitlines()[0]
    assert "mean reward delta -1.0000 (candidate - baseline); flipped to pass 0, to fail 8" in out
    assert err.strip() == (
        "note: the baseline started after the candidate; swap them if you meant to measure "
        "the newer run"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{base}", "{base_prefix}"],
         r"the baseline and the candidate are the same run \(\w{12}\); name two different runs"),
        (["--baseline", "{trained}", "--candidate", "{trained}"],
         r"the baseline and the candidate are the same run"),
        (["{base}", "0123456789abcdef"], r"no eval run '0123456789abcdef' in the registry; "
         r"see: vfops runs list"),
        (["{base}", "--baseline", "{trained}"], r"name the runs one way: positional BASELINE "
         r"CANDIDATE, --baseline/--candidate, or --latest, not a mix; use: vfops runs compare"),
        (["{base}", "{trained}", "--latest", "--env", "arithmetic"], r"name the runs one way"),
        (["--candidate", "{trained}"], r"no baseline run given; use: vfops runs compare "
         r"BASELINE CANDIDATE, --baseline RUN --candidate RUN, or --env ENV --latest"),
        (["{base}"], r"no candidate run given; use: vfops runs compare"),
        ([], r"no baseline run given"),
        (["--latest"], r"--latest needs --env ENV: whose newest two runs to compare"),
        (["{base}", "{trained}", "--env", "arithmetic"], r"--env goes with --latest only"),
        (["--latest", "--env", "echo_env"], r"--latest needs two runs of 'echo_env', the registry "
         r"has 0; see: vfops runs list --env echo_env"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line(
    db_url: str, runs: tuple[str, str], args: list[str], message: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    base, trained = runs
    monkeypatch.setenv("VFOPS_DATABASE_URL", db_url)
    filled = [a.format(base=base, base_prefix=base[:10], trained=trained) for a in args]
    code, err = run_vfops(["runs", "compare", *filled], monkeypatch)
    assert code == 2, err
    assert capsys.readouterr().out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert re.match(rf"error: {message}", err.strip()), err
