"""Bad input through the real CLI: one line naming the problem and the fix, a non-zero
exit, and nothing half-written.

Each case runs ``python -m vfops ...`` in a subprocess with its own ``VFOPS_HOME`` (the
SQLite registry, artifacts, Prefect home) under ``tmp_path``, then checks that stderr is
exactly one ``error: ...`` line (no traceback) matching the case's pattern (which names
the fix), that the registry holds the same eval runs as before, and that nothing
appeared or changed under ``tmp_path`` outside the home (no run folder, no partial
export, no published artifact).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.registry_fixtures import PG_URL
from vfops.testing import StubConfig, StubServer

REPO = Path(__file__).resolve().parent.parent
ARITHMETIC = REPO / "environments" / "arithmetic"
TRAIN_CONFIG = REPO / "configs" / "train" / "cpu_lucky_digit.toml"
CLOSED_PORT = "http://127.0.0.1:9"
NOT_UTF8 = b'# caf\xe9\nx = "\xff"\n'
MISSING_PG_DB = PG_URL.rsplit("/", 1)[0] + "/vfops_no_such_database"
CLOSED_PG = "postgresql+psycopg://postgres@127.0.0.1:9/test"
NIGHTLY = '[nightly]\nenvironments = ["arithmetic"]\nendpoints = ["small"]\n'

Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    """Command line after ``vfops``; ``{tmp}`` and ``{stub}`` are filled in."""
    expect: str
    """Regex the one error line must match: the problem, then the fix."""
    setup: Setup | None = None
    env: dict[str, str] = field(default_factory=dict)


def write(name: str, content: bytes | str) -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)

    return setup


def package_with(pyproject: bytes | str) -> Setup:
    """A copy of the arithmetic package whose pyproject.toml is ``pyproject``."""

    def setup(tmp: Path) -> None:
        shutil.copytree(ARITHMETIC, tmp / "pkg", ignore=shutil.ignore_patterns("*.egg-info"))
        write("pkg/pyproject.toml", pyproject)(tmp)

    return setup


def recorded_run(tmp: Path) -> None:
    """A completed run with no rollouts in the case's registry (for runs/export cases)."""
    from vfops.registry import NewRun, create_run, dispose_engines, get_engine, session_scope

    with session_scope(get_engine(registry_url(tmp))) as session:
        create_run(
            session,
            NewRun(
                run_id="feedc0de" * 4,
                environment_name="arithmetic",
                environment_version="0.1.0",
                environment_content_hash="0" * 64,
                model="stub-model",
                num_examples=1,
                rollouts_per_example=1,
                config_fingerprint="f" * 64,
                status="completed",
            ),
        )
    dispose_engines()


def both(*setups: Setup) -> Setup:
    def setup(tmp: Path) -> None:
        for one in setups:
            one(tmp)

    return setup


EVAL = ("eval", "arithmetic", "-m", "stub-model", "-b", "{stub}", "-o", "{tmp}/out", "-q")
RUN = "feedc0de" * 4

CASES = [
    # ------------------------------------------------------------------ eval: values
    Case("eval-n-zero", (*EVAL, "-n", "0"), r"--num-examples must be positive .*-1 for all"),
    Case("eval-n-negative", (*EVAL, "-n", "-5"), r"--num-examples must be positive"),
    Case("eval-r-zero", (*EVAL, "-r", "0"), r"--rollouts-per-example must be a positive"),
    Case("eval-c-zero", (*EVAL, "-c", "0"), r"--max-concurrent must be a positive"),
    Case("eval-temperature-negative", (*EVAL, "-T", "-3"),
         r"temperature must be >= 0, got -3.*--temperature"),
    Case("eval-temperature-nan", (*EVAL, "-T", "nan"),
         r"temperature must be a finite number, got nan; .*--temperature"),
    Case("eval-top-p-zero", (*EVAL, "-S", '{"top_p": 0}'),
         r"top_p must be > 0 and <= 1, got 0.*--sampling-args"),
    Case("eval-top-p-above-one", (*EVAL, "-S", '{"top_p": 1.5}'),
         r"top_p must be > 0 and <= 1, got 1.5; .*--sampling-args"),
    Case("eval-header-credential", (*EVAL, "-S", '{"extra_headers": {"Authorization": "B s"}}'),
         r"extra_headers carries a credential \(Authorization\), which would be recorded.*-k VAR"),
    Case("eval-header-api-key", (*EVAL, "-S", '{"extra_headers": {"X-Goog-Api-Key": "s"}}'),
         r"extra_headers carries a credential \(X-Goog-Api-Key\)"),
    Case("eval-headers-not-object", (*EVAL, "-S", '{"extra_headers": ["a"]}'),
         r"extra_headers must be an object of header names to values"),
    Case("eval-max-tokens-zero", (*EVAL, "-t", "0"),
         r"max_tokens must be > 0, got 0.*--max-tokens"),
    Case("eval-max-tokens-string", (*EVAL, "-S", '{"max_tokens": "64"}'),
         r"max_tokens must be an integer, got '64'"),
    Case("eval-sampling-not-json", (*EVAL, "-S", "{temperature: 1}"),
         r"--sampling-args is not valid JSON .*pass an object"),
    Case("eval-env-args-not-object", (*EVAL, "-a", "[1, 2]"),
         r"--env-args must be a JSON object, got list"),
    Case("eval-request-timeout-zero", (*EVAL, "--request-timeout", "0"),
         r"--request-timeout must be > 0"),
    Case("eval-max-retries-negative", (*EVAL, "--max-retries", "-1"),
         r"--max-retries must be >= 0"),
    Case("eval-max-error-rate-above-1", (*EVAL, "--max-error-rate", "1.5"),
         r"--max-error-rate must be between 0 and 1"),
    Case("eval-registry-retry-negative", (*EVAL,),
         r"VFOPS_REGISTRY_RETRY_S must be a number of seconds >= 0.*fix or unset it",
         env={"VFOPS_REGISTRY_RETRY_S": "-1"}),
    # ------------------------------------------------------------------ eval: files, places
    Case("eval-unknown-env", ("eval", "no_such_env", "-m", "m", "-b", "{stub}", "-o", "{tmp}/out"),
         r"no_such_env.*vfops env (list|install)"),
    Case("eval-output-is-a-file", (*EVAL, "-n", "2", "-o", "{tmp}/taken"),
         r"output folder .*taken is a file.*pass a folder", write("taken", "mine\n")),
    Case("eval-output-under-a-file", (*EVAL, "-n", "2", "-o", "{tmp}/taken/out"),
         r"taken is a file.*pass a folder", write("taken", "mine\n")),
    Case("eval-endpoints-not-utf8", ("eval", "arithmetic", "-m", "small", "-e", "{tmp}/e.toml",
                                     "-o", "{tmp}/out"),
         r"e\.toml: not UTF-8 text .*save it as UTF-8", write("e.toml", NOT_UTF8)),
    Case("eval-endpoints-missing", ("eval", "arithmetic", "-m", "small", "-e", "{tmp}/e.toml",
                                    "-o", "{tmp}/out"),
         r"e\.toml: file not found; create it"),
    Case("eval-unreachable-endpoint", ("eval", "arithmetic", "-m", "m", "-b", f"{CLOSED_PORT}/v1",
                                       "-o", "{tmp}/out"),
         r"cannot reach base URL .*check --base-url"),
    Case("eval-resume-unknown-run", (*EVAL, "--resume", "0123456789abcdef"),
         r"no eval run '0123456789abcdef'.*vfops runs list"),
    # ------------------------------------------------------------------ env publish / install
    Case("publish-not-a-package", ("env", "publish", "{tmp}"),
         r"not an environment package .*vfops env init"),
    Case("publish-pyproject-not-utf8", ("env", "publish", "{tmp}/pkg"),
         r"pyproject\.toml: not UTF-8 text .*save it as UTF-8", package_with(NOT_UTF8)),
    Case("publish-pyproject-invalid-toml", ("env", "publish", "{tmp}/pkg"),
         r"pyproject\.toml: invalid TOML at line 1.*fix the syntax",
         package_with("[project\nname = 'x'\n")),
    Case("publish-bad-bump", ("env", "publish", str(ARITHMETIC), "--bump", "huge"),
         r"--bump must be patch, minor or major"),
    Case("install-missing-folder", ("env", "install", "{tmp}/nowhere"),
         r"not an environment package .*vfops env init"),
    Case("install-unpublished", ("env", "install", "no_such_env@1.0.0"),
         r"'no_such_env' has no published version; publish it with: vfops env publish"),
    Case("install-bad-reference", ("env", "install", "@1.0.0"),
         r"invalid environment reference .*NAME@VERSION"),
    Case("gc-negative-grace", ("env", "gc", "--grace-hours", "-1"),
         r"--grace-hours must be 0 or more"),
    # ------------------------------------------------------------------ runs
    Case("runs-show-unknown", ("runs", "show", "0123456789abcdef"),
         r"no eval run '0123456789abcdef'.*vfops runs list"),
    Case("runs-compare-unknown", ("runs", "compare", RUN, "0123456789abcdef"),
         r"no eval run '0123456789abcdef'.*vfops runs list", recorded_run),
    Case("runs-export-unknown", ("runs", "export", "0123456789abcdef", "--to", "{tmp}/x"),
         r"no eval run '0123456789abcdef'.*vfops runs list"),
    Case("runs-export-to-a-file", ("runs", "export", RUN, "--to", "{tmp}/taken"),
         r"taken is a file.*pass a writable folder .* to --to",
         both(recorded_run, write("taken", "mine\n"))),
    Case("runs-export-unwritable", ("runs", "export", RUN, "--to", "{tmp}/taken/export"),
         r"taken is a file.*pass a writable folder .* to --to",
         both(recorded_run, write("taken", "mine\n"))),
    # ------------------------------------------------------------------ promote
    Case("promote-n-zero", ("promote", "tiny", "1", "--env", "arithmetic", "-n", "0"),
         r"--num-examples must be positive"),
    Case("promote-sampling-not-json", ("promote", "tiny", "1", "--env", "arithmetic", "-S", "{x"),
         r"--sampling-args is not valid JSON .*pass an object"),
    Case("promote-temperature-negative",
         ("promote", "tiny", "1", "--env", "arithmetic", "-S", '{"temperature": -1}'),
         r"temperature must be >= 0, got -1; .*--sampling-args"),
    # the same sampling flags as vfops eval (-T, -t), checked the same way
    Case("promote-max-tokens-zero", ("promote", "tiny", "1", "--env", "arithmetic", "-t", "0"),
         r"max_tokens must be > 0, got 0; set a valid value with --max-tokens"),
    Case("promote-temperature-flag-negative",
         ("promote", "tiny", "1", "--env", "arithmetic", "-T", "-1"),
         r"temperature must be >= 0, got -1.0; set a valid value with --temperature"),
    Case("promote-bad-run", ("promote", "tiny", "1", "--run", "arithmetic"),
         r"--run 'arithmetic' is not ENV=RUN_ID"),
    # ------------------------------------------------------------------ deploy
    Case("deploy-prefect-unreachable", ("deploy",),
         r"cannot reach Prefect's API at .*set PREFECT_API_URL to a running server",
         env={"PREFECT_API_URL": f"{CLOSED_PORT}/api"}),
    # no server configured: not deployed to an ephemeral one that vanishes with the command
    Case("deploy-no-prefect-api", ("deploy",),
         r"vfops deploy needs a running Prefect server .*prefect server start.*"
         r"vfops stack up.*set PREFECT_API_URL"),
    Case("deploy-nightly-not-utf8", ("deploy", "--nightly-config", "{tmp}/n.toml"),
         r"n\.toml: not UTF-8 text .*save it as UTF-8", write("n.toml", NOT_UTF8)),
    Case("deploy-nightly-negative-n", ("deploy", "--nightly-config", "{tmp}/n.toml"),
         r"\[nightly\]\.num_examples: must be > 0, got -3",
         write("n.toml", NIGHTLY + "num_examples = -3\n")),
    Case("deploy-nightly-wrong-type", ("deploy", "--nightly-config", "{tmp}/n.toml"),
         r"\[nightly\]\.rollouts_per_example: must be an integer, got '4'",
         write("n.toml", NIGHTLY + 'rollouts_per_example = "4"\n')),
    Case("deploy-nightly-unknown-key", ("deploy", "--nightly-config", "{tmp}/n.toml"),
         r"\[nightly\]\.num_exmples: unknown key; did you mean 'num_examples'",
         write("n.toml", NIGHTLY + "num_exmples = 5\n")),
    Case("deploy-nightly-bad-cron", ("deploy", "--nightly-config", "{tmp}/n.toml"),
         r"\[schedule\]\.cron: '61 \* \* \* \*' is not a valid cron expression; use five",
         write("n.toml", '[schedule]\ncron = "61 * * * *"\n' + NIGHTLY)),
    Case("deploy-nightly-bad-sampling", ("deploy", "--nightly-config", "{tmp}/n.toml"),
         r"\[\[nightly\.sampling\]\] #1\.args: temperature must be >= 0, got -1",
         write("n.toml", NIGHTLY + "[[nightly.sampling]]\nargs = {temperature = -1}\n")),
    Case("deploy-cron-without-config", ("deploy", "--nightly-cron", "0 3 * * *"),
         r"--nightly-cron needs --nightly-config"),
    Case("deploy-unknown-pool-type", ("deploy", "--pool-type", "podman"),
         r"vfops deploy: pool_type: .*'process'.*got 'podman'"),
    Case("deploy-docker-without-image", ("deploy", "--pool-type", "docker"),
         r"a docker pool runs flows in an image; pass --image"),
    Case("deploy-heartbeat-timeout-too-short", ("deploy", "--heartbeat-timeout-s", "20"),
         r"vfops deploy: heartbeat_timeout_s: must be >= 35"),
    # ------------------------------------------------------------------ train
    Case("train-config-missing", ("train", "{tmp}/t.toml"),
         r"t\.toml: file not found; create it or pass the right path"),
    Case("train-config-not-utf8", ("train", "{tmp}/t.toml"),
         r"t\.toml: not UTF-8 text .*save it as UTF-8",
         write("t.toml", NOT_UTF8)),
    Case("train-resume-missing", ("train", str(TRAIN_CONFIG), "--resume", "{tmp}/ckpt"),
         r"resume .*ckpt' is not a folder; pass a checkpoint folder"),
    Case("train-deepspeed-missing", ("train", str(TRAIN_CONFIG), "--deepspeed", "{tmp}/z.json"),
         r"deepspeed config .*z\.json' does not exist"),
    # before torch loads and the tiny model it would build is written
    Case("train-environment-unknown", ("train", "{tmp}/t.toml"),
         r"unknown environment 'no_such_env' \(installed: .*\); install it with: vfops env "
         r"install PATH",
         write("t.toml", '[model]\npath = "model"\nbuild_tiny_if_missing = true\n'
               '[environment]\nid = "no_such_env"\n[run]\noutput_dir = "out"\n')),
    # ------------------------------------------------------------------ db / registry
    Case("db-upgrade-missing-postgres-db", ("db", "upgrade", "--url", MISSING_PG_DB),
         r"cannot connect to the registry database .*vfops_no_such_database.*"
         r"the database exists \(create it\), or fix the database URL \(VFOPS_DATABASE_URL"),
    Case("db-current-missing-postgres-db", ("db", "current", "--url", MISSING_PG_DB),
         r"cannot connect to the registry database .*or fix the database URL"),
    Case("db-upgrade-sqlite-under-a-file", ("db", "upgrade", "--url", "sqlite:///{tmp}/taken/r.db"),
         r"taken is a file, not a folder; set VFOPS_HOME or fix the database URL",
         write("taken", "mine\n")),
    Case("runs-list-postgres-down", ("runs", "list"),
         r"cannot connect to the registry database postgresql\+psycopg://.*127\.0\.0\.1:9/.*"
         r"check that the server runs", env={"VFOPS_DATABASE_URL": CLOSED_PG}),
    Case("db-upgrade-unsupported-url", ("db", "upgrade", "--url", "mysql://u@h/db"),
         r"unsupported registry database .*postgresql\+psycopg"),
    Case("home-under-a-file", ("runs", "list"),
         r"VFOPS_HOME .*taken is a file, not a folder; set VFOPS_HOME to a writable folder",
         write("taken", "mine\n"), env={"VFOPS_HOME": "{tmp}/taken/home"}),
]  # fmt: skip


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:
        yield server


def registry_url(tmp: Path) -> str:
    return f"sqlite:///{tmp / 'home' / 'registry.db'}"


def eval_run_ids(tmp: Path) -> list[str]:
    database = tmp / "home" / "registry.db"
    if not database.exists():
        return []
    engine = create_engine(registry_url(tmp), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return sorted(connection.execute(text("SELECT id FROM eval_runs")).scalars())
    finally:
        engine.dispose()


def snapshot(tmp: Path) -> dict[str, bytes]:
    """Every file outside the home (and every artifact inside it), with its content."""
    files = {p for p in tmp.rglob("*") if p.is_file() and "home" not in p.relative_to(tmp).parts}
    files |= {p for p in (tmp / "home" / "artifacts").rglob("*") if p.is_file()}
    return {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(files)}


def fill_in(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def vfops(args: list[str], tmp: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "VFOPS_HOME": str(tmp / "home"),
        "PREFECT_HOME": str(tmp / "home" / "prefect"),
        "VFOPS_TRACKING": "0",  # a run that fails first must not need MLflow to say so
        "COLUMNS": "200",
        **extra,
    }
    for name in ("VFOPS_DATABASE_URL", "OPENAI_API_KEY", "PREFECT_API_URL", "VFOPS_ENDPOINTS"):
        if name not in extra:
            env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(
    case: Case, tmp_path: Path, stub: StubServer
) -> None:
    (tmp_path / "home").mkdir()
    if case.setup is not None:
        case.setup(tmp_path)
    fill = {"tmp": str(tmp_path), "stub": stub.base_url}
    args = [fill_in(arg, fill) for arg in case.args]
    extra = {name: fill_in(value, fill) for name, value in case.env.items()}
    runs_before, files_before = eval_run_ids(tmp_path), snapshot(tmp_path)

    proc = vfops(args, tmp_path, extra)

    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert re.search(case.expect, lines[0]), lines[0]
    assert eval_run_ids(tmp_path) == runs_before, "an eval run was recorded"
    assert snapshot(tmp_path) == files_before, "something was written"


@pytest.mark.parametrize("n", ["100000000000", "-1"])
def test_a_run_records_the_examples_that_ran(tmp_path: Path, stub: StubServer, n: str) -> None:
    """-n above the dataset's size (common: "up to N") or -1 (all) runs every example
    and records how many: 7 here, not N."""
    args = ["eval", "arithmetic", "-a", '{"num_examples": 7}', "-m", "stub-model", "-n", n,
            "-r", "2", "-b", stub.base_url, "-o", str(tmp_path / "out")]  # fmt: skip
    proc = vfops(args, tmp_path, {})
    assert proc.returncode == 0, proc.stderr
    (metadata_path,) = (tmp_path / "out").glob("evals/*/*/metadata.json")
    metadata = orjson.loads(metadata_path.read_bytes())
    assert metadata["num_examples"] == 7 and metadata["summary"]["rollouts"] == 14
    engine = create_engine(registry_url(tmp_path), poolclass=NullPool)
    with engine.connect() as connection:
        (row,) = connection.execute(text("SELECT num_examples, status FROM eval_runs")).all()
    engine.dispose()
    assert tuple(row) == (7, "completed")
