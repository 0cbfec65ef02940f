"""Nightly comparison over real registry runs (SQLite and PostgreSQL); ``nightly.toml``."""

from __future__ import annotations

import datetime as dt
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry_fixtures import DIALECTS, database_url, make_record, store_rollouts
from vfops._config import ConfigError
from vfops._errors import VfopsError
from vfops.nightly import (
    DEFAULT_NIGHTLY_CRON,
    NightlyConfig,
    compare_with_previous,
    load_nightly,
    nightly_history,
    nightly_tags,
)
from vfops.registry import NewRun, create_run, finish_run, get_engine, session_scope

EXAMPLES, ROLLOUTS = 150, 4
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=DIALECTS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def nightly_run(
    db_url: str,
    day: dt.date,
    success: dict[int, float],
    rng: random.Random,
    *,
    model: str = "m",
    started: dt.datetime | None = None,
) -> str:
    engine = get_engine(db_url)
    with session_scope(engine) as session:
        run = create_run(
            session,
            NewRun(
                environment_name="arithmetic",
                environment_version="1.0.0",
                environment_content_hash="c" * 64,
                model=model,
                num_examples=EXAMPLES,
                rollouts_per_example=ROLLOUTS,
                config_fingerprint=f"fp-{day}-{model}",
                tags=nightly_tags(day),
            ),
        )
        run.started_at = started or dt.datetime.combine(day, dt.time(3), tzinfo=dt.UTC)
        run_id = run.id
    records = [
        make_record(e, i, reward=1.0 if rng.random() < success[e] else 0.0)
        for e in range(EXAMPLES)
        for i in range(ROLLOUTS)
    ]
    store_rollouts(engine, run_id, records)
    mean = sum(r.reward or 0.0 for r in records) / len(records)
    with session_scope(engine) as session:
        finish_run(session, run_id, "completed", {"reward_mean": mean, "reward_stderr": 0.01})
    return run_id


def test_first_night_has_no_baseline(db_url: str) -> None:
    rng = random.Random(0)
    run_id = nightly_run(db_url, dt.date(2026, 11, 1), {e: 0.7 for e in range(EXAMPLES)}, rng)
    comparison = compare_with_previous(get_engine(db_url), run_id)
    assert comparison.previous_run_id is None and not comparison.regressed


def test_planted_drop_is_flagged(db_url: str) -> None:
    rng = random.Random(1)
    success = {e: 0.7 for e in range(EXAMPLES)}
    first = nightly_run(db_url, dt.date(2026, 11, 1), success, rng)
    dropped = {e: (0.0 if e < 40 else p) for e, p in success.items()}
    second = nightly_run(db_url, dt.date(2026, 11, 2), dropped, rng)
    comparison = compare_with_previous(get_engine(db_url), second)
    assert comparison.previous_run_id == first
    assert comparison.regressed
    assert "noise floor" in comparison.report.summary


def test_sampling_noise_alone_is_not_flagged(db_url: str) -> None:
    rng = random.Random(2)
    success = {e: rng.choice([0.2, 0.5, 0.8]) for e in range(EXAMPLES)}
    nightly_run(db_url, dt.date(2026, 11, 1), success, rng)
    second = nightly_run(db_url, dt.date(2026, 11, 2), success, rng)
    comparison = compare_with_previous(get_engine(db_url), second)
    assert comparison.previous_run_id is not None and not comparison.regressed


def test_other_models_are_not_baselines_and_history_is_per_model(db_url: str) -> None:
    rng = random.Random(3)
    success = {e: 0.7 for e in range(EXAMPLES)}
    nightly_run(db_url, dt.date(2026, 11, 1), success, rng, model="other")
    run_id = nightly_run(db_url, dt.date(2026, 11, 2), success, rng)
    assert compare_with_previous(get_engine(db_url), run_id).previous_run_id is None
    history = nightly_history(get_engine(db_url), "arithmetic")
    assert set(history) == {"arithmetic · other", "arithmetic · m"}
    assert [len(series) for series in history.values()] == [1, 1]
    # named as the sweep named the endpoint, as in the tables
    renamed = nightly_history(get_engine(db_url), "arithmetic", aliases={"m": "small"})
    assert set(renamed) == {"arithmetic · other", "arithmetic · small"}


def test_history_is_by_night_not_by_start_time(db_url: str) -> None:
    """A night that ran late (or was re-run the next morning) stays on its own date."""
    rng = random.Random(4)
    success = {e: 0.7 for e in range(EXAMPLES)}
    late = dt.datetime(2026, 11, 3, 9, 30, tzinfo=dt.UTC)  # the night of Nov 1, two days late
    nightly_run(db_url, dt.date(2026, 11, 1), success, rng, started=late)
    nightly_run(db_url, dt.date(2026, 11, 2), success, rng)
    (series,) = nightly_history(get_engine(db_url), "arithmetic").values()
    assert [night for night, _, _ in series] == ["2026-11-01", "2026-11-02"]


# --- nightly.toml: checked before anything reaches Prefect ---------------------------------

GOOD_NIGHTLY = (
    '[schedule]\ncron = "0 4 * * *"\n'
    '[nightly]\nenvironments = ["arithmetic"]\nendpoints = ["stub"]\n'
    "num_examples = 20\nrollouts_per_example = 4\n"
)


def test_nightly_file_loads_and_becomes_deployment_parameters(tmp_path: Path) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text(GOOD_NIGHTLY)
    spec = load_nightly(path)
    assert spec.schedule.cron == "0 4 * * *"
    # only what the file sets: the flow's defaults stay defined once, in NightlyConfig
    assert spec.deployment_parameters() == {
        "config": {
            "environments": ["arithmetic"],
            "endpoints": ["stub"],
            "num_examples": 20,
            "rollouts_per_example": 4,
        }
    }
    assert NightlyConfig.model_validate(spec.deployment_parameters()["config"]) == spec.nightly
    overridden = load_nightly(path, cron="30 2 * * 1-5")
    assert overridden.schedule.cron == "30 2 * * 1-5"
    assert overridden.deployment_parameters() == spec.deployment_parameters()
    path.write_text(GOOD_NIGHTLY.replace('[schedule]\ncron = "0 4 * * *"\n', ""))
    assert load_nightly(path).schedule.cron == DEFAULT_NIGHTLY_CRON


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        (
            GOOD_NIGHTLY.replace("0 4 * * *", "61 4 * * *"),
            [
                "[schedule].cron: '61 4 * * *' is not a valid cron expression; use five fields: "
                'minute hour day-of-month month day-of-week, e.g. "0 3 * * *"'
            ],
        ),
        (
            GOOD_NIGHTLY.replace("num_examples = 20", "num_examples = -5").replace(
                "rollouts_per_example = 4", "rollouts_per_example = 0"
            ),
            [
                "[nightly].num_examples: must be > 0, got -5",
                "[nightly].rollouts_per_example: must be > 0, got 0",
            ],
        ),
        (
            GOOD_NIGHTLY.replace("num_examples = 20", 'num_examples = "20"')
            + 'alpha = 0.5\ndate = "tomorrow"\nendpoint = ["x"]\n',
            [
                "[nightly].num_examples: must be an integer, got '20'",
                "[nightly].alpha: must be < 0.5, got 0.5",
                "[nightly].date: must be a date YYYY-MM-DD, got 'tomorrow'",
                "[nightly].endpoint: unknown key; did you mean 'endpoints'?",
            ],
        ),
        (
            GOOD_NIGHTLY.replace('["arithmetic"]', '["arithmetic", "arithmetic@1.2"]'),
            [
                "[nightly].environments: invalid version in environment reference "
                "'arithmetic@1.2'; use NAME@latest or NAME@MAJOR.MINOR.PATCH (e.g. 1.2.3)"
            ],
        ),
        ("[schedule]\ncron = 3\n", ["[schedule].cron: must be a quoted string, e.g. \"...\", got 3",
                                    "[nightly]: missing; add the [nightly] table"]),
    ],
)  # fmt: skip
def test_bad_nightly_file_names_every_problem(tmp_path: Path, text: str, lines: list[str]) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_nightly(path)
    assert str(info.value).splitlines() == [f"{path}: {line}" for line in lines]


def test_cron_override_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text(GOOD_NIGHTLY)
    with pytest.raises(ConfigError, match=r"^--nightly-cron: cron: 'every night' is not a valid"):
        load_nightly(path, cron="every night")


def _deploy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Prefect's API is a closed port: contacting it would fail with another message
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PREFECT_API_URL": "http://127.0.0.1:9/api",
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
    }
    return subprocess.run(
        [sys.executable, "-m", "vfops", "deploy", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_nightly_cron_needs_a_nightly_file() -> None:
    from vfops.cli._deploy import _nightly_deployment

    assert _nightly_deployment(None, None) == {}
    with pytest.raises(VfopsError, match="--nightly-cron needs --nightly-config"):
        _nightly_deployment(None, "0 3 * * *")


def test_deploy_refuses_a_bad_nightly_file_before_prefect(tmp_path: Path) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text(GOOD_NIGHTLY.replace("rollouts_per_example = 4", "rollouts_per_example = -1"))
    proc = _deploy(tmp_path, "--nightly-config", str(path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {path}: [nightly].rollouts_per_example: must be > 0, got -1"
    ]
    assert proc.stdout == ""

    path.write_text(GOOD_NIGHTLY)
    proc = _deploy(tmp_path, "--nightly-config", str(path), "--nightly-cron", "0 25 * * *")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "error: --nightly-cron: cron: '0 25 * * *' is not a valid cron expression; use "
        'five fields: minute hour day-of-month month day-of-week, e.g. "0 3 * * *"'
    ]
