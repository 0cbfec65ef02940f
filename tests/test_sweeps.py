"""Sweeps without Prefect: the matrix, refusals before any model call, run/resume/reuse.

Runs against the stub server on SQLite and PostgreSQL registries, with the example
environment packages installed in the development virtualenv.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from tests.registry_fixtures import DIALECTS, database_url, stored_count, stored_rollouts
from tests.request_gate import RequestGate
from vfops._config import ConfigError
from vfops._errors import VfopsError
from vfops.registry import EvalRunRow, RunBusyError, get_engine
from vfops.sweeps import (
    WORKER_NAME_ENV_VAR,
    Cell,
    SamplingConfig,
    SweepSpec,
    cell_result_from_registry,
    load_sweep,
    parse_env_ref,
    plan_sweep,
    run_cell_async,
    run_of_flow_run,
    sweep_table,
    validate_sweep,
)
from vfops.testing import StubConfig, StubServer

REPO = Path(__file__).resolve().parent.parent
MISSING_KEY_VAR = "VFOPS_TEST_SWEEP_MISSING_KEY"


@pytest.fixture(params=DIALECTS)
def db_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    for url in database_url(request.param, tmp_path):
        monkeypatch.setenv("VFOPS_DATABASE_URL", url)
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for url in database_url("sqlite", tmp_path):
        monkeypatch.setenv("VFOPS_DATABASE_URL", url)
        yield url


def write_endpoints(path: Path, base_url: str) -> Path:
    path.write_text(
        f"""
[[endpoint]]
alias = "stub"
model = "stub-model"
base_url = "{base_url}"

[[endpoint]]
alias = "remote"
model = "big-model"
base_url = "https://api.example.invalid/v1"
api_key_var = "{MISSING_KEY_VAR}"
"""
    )
    return path


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        yield server


@pytest.fixture
def endpoints(tmp_path: Path, stub: StubServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(MISSING_KEY_VAR, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return write_endpoints(tmp_path / "endpoints.toml", stub.base_url)


def spec(endpoints_toml: Path, /, **overrides: Any) -> SweepSpec:
    fields: dict[str, Any] = {
        "environments": ["arithmetic"],
        "endpoints": ["stub"],
        "endpoints_file": str(endpoints_toml),
        "num_examples": 4,
        "rollouts_per_example": 2,
        "max_concurrent": 8,
        "env_args": {"arithmetic": {"num_examples": 10}},
    }
    names = {ref.partition("@")[0] for ref in overrides.get("environments", ["arithmetic"])}
    if "arithmetic" not in names:  # env_args may only name environments of the sweep
        del fields["env_args"]
    fields.update(overrides)
    return SweepSpec(**fields)


def spec_data(endpoints_toml: Path, /, **overrides: Any) -> dict[str, Any]:
    """The fields of :func:`spec` as TOML-shaped data (unvalidated)."""
    data = spec(endpoints_toml).model_dump(exclude_defaults=True)
    data.update(overrides)
    return data


def run_rows(url: str) -> int:
    with Session(get_engine(url)) as session:
        return int(session.scalar(select(func.count()).select_from(EvalRunRow)) or 0)


# --- the matrix -----------------------------------------------------------------------


def test_plan_is_the_full_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = write_endpoints(tmp_path / "ep.toml", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("VFOPS_ENDPOINTS", str(file))
    sweep = SweepSpec(
        environments=["arithmetic", "guess_number@latest", "calculator@1.2.3"],
        endpoints=["stub", "remote"],
        sampling=[
            SamplingConfig(name="greedy", args={"temperature": 0}),
            SamplingConfig(name="hot"),
        ],
        env_args={"arithmetic": {"num_examples": 3}},
    )
    cells = plan_sweep(sweep)
    assert len(cells) == 3 * 2 * 2
    assert len({cell.label for cell in cells}) == len(cells)
    assert {cell.endpoints_file for cell in cells} == {str(file.resolve())}
    first = cells[0]
    assert (first.env_name, first.ref_kind, first.version) == ("arithmetic", "installed", None)
    assert first.env_args == {"num_examples": 3}
    assert first.sampling.args == {"temperature": 0}
    pinned = [c for c in cells if c.env_name == "calculator"]
    assert {(c.ref_kind, c.version) for c in pinned} == {("pinned", "1.2.3")}
    assert all(c.env_args == {} for c in pinned)
    # cells travel as Prefect task parameters: JSON round trip
    assert Cell.model_validate_json(first.model_dump_json()) == first


def test_defaults_and_schema_for_the_ui() -> None:
    sweep = SweepSpec(environments=["arithmetic"], endpoints=["stub"])
    assert [s.name for s in sweep.sampling] == ["default"]
    schema = SweepSpec.model_json_schema()
    properties = schema["properties"]
    assert all(properties[name].get("description") for name in properties)
    assert properties["num_examples"]["exclusiveMinimum"] == 0


def test_parse_env_ref() -> None:
    assert parse_env_ref("arithmetic") == ("arithmetic", "installed", None)
    assert parse_env_ref("arithmetic@latest") == ("arithmetic", "latest", None)
    assert parse_env_ref("arithmetic@1.2.3") == ("arithmetic", "pinned", "1.2.3")
    for bad in ("@1.0.0", "arithmetic@", "arithmetic@1.2", "arithmetic@v1"):
        with pytest.raises(VfopsError):
            parse_env_ref(bad)


# --- refusals before any model call ----------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"environments": ["no_such_env"]}, "unknown environment 'no_such_env' (installed: "),
        ({"environments": ["arithmetic@9.9.9"]}, "arithmetic@9.9.9 is not published"),
        ({"environments": ["arithmetic@latest"]}, "'arithmetic' has no published version"),
        ({"endpoints": ["nope"]}, "unknown endpoint alias 'nope'"),
        ({"endpoints": ["remote"]}, f"environment variable {MISSING_KEY_VAR}, which is not set"),
        ({"endpoints_file": "/nonexistent/endpoints.toml"}, "endpoints file /nonexistent"),
    ],
)
def test_validation_refuses_with_one_clear_line(
    sqlite_url: str, endpoints: Path, stub: StubServer, overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(VfopsError) as raised:
        validate_sweep(spec(endpoints, **overrides))
    message = str(raised.value)
    assert expected in message
    assert "\n" not in message
    assert stub.stats["requests"] == 0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"environments": ["arithmetic@1.2"]},
            "environments: invalid version in environment reference 'arithmetic@1.2'",
        ),
        (
            {"environments": ["arithmetic", "arithmetic"]},
            "environments: lists 'arithmetic' twice; give each one once",
        ),
        ({"endpoints": ["stub", " stub"]}, "endpoints: lists 'stub' twice"),
        ({"environments": []}, "environments: needs at least 1 item(s), got 0"),
        ({"env_args": {"other": {}}}, "env_args has arguments for 'other'"),
        (
            {"sampling": [{"name": "a"}, {"name": "b"}]},
            "sampling: sampling configs 'a' and 'b' have the same arguments",
        ),
        (
            {"sampling": [{"name": "a"}, {"name": "a", "args": {"t": 1}}]},
            "sampling: lists 'a' twice",
        ),
        ({"num_examples": 0}, "num_examples: must be > 0, got 0"),
        ({"rollouts_per_example": -2}, "rollouts_per_example: must be > 0, got -2"),
        ({"num_examples": "5"}, "num_examples: must be an integer, got '5'"),
        ({"num_exampels": 5}, "num_exampels: unknown key; did you mean 'num_examples'?"),
        (
            {"sampling": [{"name": "a", "arg": {}}]},
            "[[sampling]] #1.arg: unknown table; did you mean 'args'?",
        ),
    ],
)
def test_a_bad_spec_names_the_field(
    endpoints: Path, overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        SweepSpec.from_data(spec_data(endpoints, **overrides), source="sweep")
    assert str(raised.value).startswith(f"sweep: {expected}")
    assert "\n" not in str(raised.value)


def test_every_problem_of_a_spec_is_reported_at_once(endpoints: Path, tmp_path: Path) -> None:
    file = tmp_path / "sweep.toml"
    file.write_text(
        'environments = ["arithmetic", "arithmetic"]\nendpoints = ["stub"]\n'
        "num_examples = -1\nrollouts_per_example = 0\nmax_concurent = 4\n"
        '[[sampling]]\nname = ""\n'
    )
    with pytest.raises(ConfigError) as raised:
        load_sweep(file)
    assert str(raised.value).splitlines() == [
        f"{file}: environments: lists 'arithmetic' twice; give each one once",
        f"{file}: [[sampling]] #1.name: must not be empty",
        f"{file}: num_examples: must be > 0, got -1",
        f"{file}: rollouts_per_example: must be > 0, got 0",
        f"{file}: max_concurent: unknown key; did you mean 'max_concurrent'?",
    ]
    file.write_text(
        f'environments = ["arithmetic"]\nendpoints = ["stub"]\nendpoints_file = "{endpoints}"\n'
        '[[sampling]]\nname = "greedy"\nargs = { temperature = 0 }\n'
    )
    loaded = load_sweep(file)
    assert [s.name for s in loaded.sampling] == ["greedy"]
    assert loaded.with_overrides({"num_examples": 7}).num_examples == 7
    with pytest.raises(ConfigError, match=r"^overrides: num_examples: must be > 0, got 0$"):
        loaded.with_overrides({"num_examples": 0})


def test_validation_lists_what_exists(sqlite_url: str, endpoints: Path) -> None:
    with pytest.raises(VfopsError, match=r"installed: .*arithmetic.*published: none"):
        validate_sweep(spec(endpoints, environments=["nope"]))
    with pytest.raises(VfopsError, match="known aliases: remote, stub"):
        validate_sweep(spec(endpoints, endpoints=["nope"]))


def test_non_positive_counts_are_refused(sqlite_url: str, endpoints: Path) -> None:
    for field in ("num_examples", "rollouts_per_example", "max_concurrent"):
        with pytest.raises(ValidationError, match="greater than 0"):
            spec(endpoints, **{field: 0})
        # a model built without validation is still refused, naming the field
        unchecked = SweepSpec.model_construct(**{**spec(endpoints).__dict__, field: -1})
        with pytest.raises(ConfigError, match=f"^SweepSpec: {field}: must be > 0, got -1$"):
            validate_sweep(unchecked)


def test_valid_sweep_returns_the_plan(sqlite_url: str, endpoints: Path) -> None:
    cells = validate_sweep(spec(endpoints, environments=["arithmetic", "guess_number"]))
    assert [c.env_name for c in cells] == ["arithmetic", "guess_number"]


# --- running cells ----------------------------------------------------------------------


async def test_same_cell_twice_reuses_the_completed_run(
    db_url: str, endpoints: Path, stub: StubServer, tmp_path: Path
) -> None:
    (cell,) = validate_sweep(spec(endpoints))
    first = await run_cell_async(cell, output_root=tmp_path / "out")
    assert first.action == "created" and first.status == "completed"
    assert first.rollouts == first.new_rollouts == 4 * 2
    assert first.version.startswith("local+") and not first.published
    assert first.reward_mean is not None and first.reward_mean > 0.5  # the stub solves it
    assert set(first.pass_at_k) == {"1", "2"}
    assert first.tokens > 0 and first.errors == 0
    requests = stub.stats["requests"]
    assert requests == 8

    second = await run_cell_async(cell, output_root=tmp_path / "out")
    assert second.action == "reused" and second.run_id == first.run_id
    assert second.new_rollouts == 0 and second.rollouts == 8
    assert second.reward_mean == first.reward_mean
    assert stub.stats["requests"] == requests
    assert run_rows(db_url) == 1

    # other tags (e.g. another night) are another run; the same tags find it again
    (tagged,) = validate_sweep(spec(endpoints, tags=["nightly:2026-11-29"]))
    night = await run_cell_async(tagged, output_root=tmp_path / "out")
    assert night.action == "created" and night.run_id != first.run_id and night.rollouts == 8
    assert night.tags == ["nightly:2026-11-29"]
    rerun = await run_cell_async(tagged)  # output_root defaults to $VFOPS_HOME/outputs
    assert rerun.action == "reused" and rerun.run_id == night.run_id
    assert run_rows(db_url) == 2

    dumped = first.to_json()
    assert "base_url" not in dumped and stub.base_url not in str(dumped)
    (row,) = sweep_table([first])
    assert row["environment"] == "arithmetic" and row["version"].startswith("local+")
    assert row["model"] == "stub" and row["rollouts"] == 8


async def test_a_cell_run_records_its_worker_and_reads_back_from_the_registry(
    db_url: str,
    endpoints: Path,
    stub: StubServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a distributed sweep relies on: the run names its worker and flow run, and
    the sweep rebuilds the cell's row from the registry alone (both dialects)."""
    (cell,) = validate_sweep(spec(endpoints))
    flow_run_id = str(uuid.uuid4())
    monkeypatch.setenv(WORKER_NAME_ENV_VAR, "gpu-box-7")
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    direct = await run_cell_async(cell, output_root=tmp_path / "out", flow_run_id=flow_run_id)
    engine = get_engine(db_url)
    assert run_of_flow_run(engine, flow_run_id) == direct.run_id
    assert run_of_flow_run(engine, str(uuid.uuid4())) is None
    with Session(engine) as session:
        row = session.get(EvalRunRow, direct.run_id)
        assert row is not None
        assert row.tags == ["worker:gpu-box-7", f"prefect.flow_run_id:{flow_run_id}"]

    read = cell_result_from_registry(cell, direct.run_id, engine=engine, since=since)
    same = "run_id env version code_hash model rollouts reward_mean reward_stderr pass_at_k "
    same += "errors tokens status outcome action"
    assert {k: getattr(read, k) for k in same.split()} == {
        k: getattr(direct, k) for k in same.split()
    }
    assert read.new_rollouts is None and read.notes == ["workers: gpu-box-7"]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    assert cell_result_from_registry(cell, direct.run_id, engine=engine, since=later).action == (
        "reused"
    )

    # another worker finishing the same run adds itself; the run's identity is unchanged
    monkeypatch.setenv(WORKER_NAME_ENV_VAR, "cpu-box-2")
    again = await run_cell_async(cell, output_root=tmp_path / "out", flow_run_id=flow_run_id)
    assert again.run_id == direct.run_id and again.action == "reused"
    with Session(engine) as session:
        row = session.get(EvalRunRow, direct.run_id)
        assert row is not None and row.tags == [
            "worker:gpu-box-7",
            f"prefect.flow_run_id:{flow_run_id}",
            "worker:cpu-box-2",
        ]
    assert run_rows(db_url) == 1


async def test_other_sampling_is_another_run(
    db_url: str, endpoints: Path, stub: StubServer, tmp_path: Path
) -> None:
    sweep = spec(
        endpoints,
        sampling=[SamplingConfig(name="a"), SamplingConfig(name="b", args={"temperature": 0.5})],
    )
    results = [await run_cell_async(cell, output_root=tmp_path) for cell in validate_sweep(sweep)]
    assert [r.action for r in results] == ["created", "created"]
    assert len({r.run_id for r in results}) == 2 and run_rows(db_url) == 2


async def test_interrupted_cell_is_resumed_to_exactly_n_times_r(
    db_url: str, endpoints: Path, tmp_path: Path
) -> None:
    n, r = 100, 2
    with StubServer(StubConfig(reply_mode="arithmetic", latency_ms=50)) as slow:
        write_endpoints(endpoints, slow.base_url)
        (cell,) = validate_sweep(
            spec(
                endpoints,
                num_examples=n,
                rollouts_per_example=r,
                max_concurrent=4,
                env_args={"arithmetic": {"num_examples": n}},
            )
        )
        engine = get_engine(db_url)
        # the stub answers 40 of the 200 model calls, then holds the rest until the cell
        # is cancelled: it stops midway, however busy the machine
        with RequestGate(slow, allow=40):
            task = asyncio.create_task(run_cell_async(cell, output_root=tmp_path))
            run_id = None
            for _ in range(2400):  # a safety net of 60 s or more
                await asyncio.sleep(0.025)
                with engine.connect() as connection:
                    run_id = connection.execute(text("SELECT id FROM eval_runs")).scalar()
                if run_id is not None and stored_count(engine, run_id) > 0:
                    break
            assert run_id is not None and stored_count(engine, run_id) > 0
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        stored = stored_count(engine, run_id)
        assert 0 < stored < n * r
        with engine.connect() as connection:
            status = connection.execute(text("SELECT status FROM eval_runs")).scalar_one()
        assert status == "interrupted"
        # a killed worker leaves its run "running": that is resumed the same way, but
        # not while a live process holds its lease (here another evaluation of this one)
        holder = f"{socket.gethostname()}@{os.getpid()}:elsewhere"
        now = dt.datetime.now(dt.UTC)
        with engine.begin() as connection:
            connection.execute(
                update(EvalRunRow).values(
                    status="running",
                    lease_owner=holder,
                    lease_expires=now + dt.timedelta(hours=1),
                )
            )
        with pytest.raises(RunBusyError, match=rf"pid {os.getpid()} on host .*wait for it"):
            await run_cell_async(cell, output_root=tmp_path)
        assert stored_count(engine, run_id) == stored
        # an expired lease (its holder died on another machine) is taken over
        with engine.begin() as connection:
            connection.execute(
                update(EvalRunRow).values(lease_expires=now - dt.timedelta(seconds=1))
            )

        resumed = await run_cell_async(cell, output_root=tmp_path)
    assert resumed.action == "resumed" and resumed.run_id == run_id
    assert resumed.status == "completed"
    assert resumed.rollouts == n * r
    assert resumed.new_rollouts == n * r - stored
    keys = [(rec.example_id, rec.rollout_index) for rec in stored_rollouts(engine, run_id)]
    assert len(keys) == len(set(keys)) == n * r == stored_count(engine, run_id)
    assert run_rows(db_url) == 1


def copy_package(source: Path, dest: Path) -> Path:
    """A copy of an environment package without build leftovers (publishing writes there)."""
    shutil.copytree(
        source,
        dest,
        ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", "__pycache__", "tests"),
    )
    return dest


async def test_latest_and_pinned_resolve_to_the_published_version(
    db_url: str, endpoints: Path, stub: StubServer, tmp_path: Path
) -> None:
    from vfops.publishing import publish_environment

    package = copy_package(REPO / "environments" / "arithmetic", tmp_path / "arithmetic")
    published = publish_environment(package, artifacts_uri=(tmp_path / "artifacts").as_uri())
    assert (published.env_name, published.version) == ("arithmetic", "0.1.0")

    (latest,) = validate_sweep(spec(endpoints, environments=["arithmetic@latest"]))
    result = await run_cell_async(latest, output_root=tmp_path)
    # the installed (editable) code is the published code: nothing to install
    assert (result.version, result.published, result.installed_now) == ("0.1.0", True, False)
    assert result.rollouts == 8 and result.action == "created"

    # the installed code and the latest version are the same code: one sweep may name both
    assert (
        len(validate_sweep(spec(endpoints, environments=["arithmetic", "arithmetic@0.1.0"]))) == 2
    )

    # same code, same configuration: the pinned ref finds the same run
    (pinned,) = validate_sweep(spec(endpoints, environments=["arithmetic@0.1.0"]))
    again = await run_cell_async(pinned, output_root=tmp_path)
    assert again.action == "reused" and again.run_id == result.run_id
    assert stub.stats["requests"] == 8


async def test_published_version_is_installed_when_the_worker_lacks_it(
    sqlite_url: str, endpoints: Path, stub: StubServer, tmp_path: Path
) -> None:
    from vfops.cli._env import init_environment
    from vfops.publishing import publish_environment

    name = f"sweep_env_{uuid.uuid4().hex[:8]}"
    package = init_environment(name, tmp_path / "src")
    publish_environment(package, artifacts_uri=(tmp_path / "artifacts").as_uri())
    site = tmp_path / "site"
    (cell,) = validate_sweep(spec(endpoints, environments=[f"{name}@latest"], env_args={}))
    try:
        result = await run_cell_async(cell, output_root=tmp_path, install_target=site)
        assert result.installed_now and result.version == "0.1.0" and result.published
        assert result.notes == [f"installed {name}@0.1.0 on this worker (it had nothing installed)"]
        assert result.rollouts == 8 and result.status == "completed"
        # now installed: the next call installs nothing and reuses the run
        again = await run_cell_async(cell, output_root=tmp_path, install_target=site)
        assert not again.installed_now and again.action == "reused"
    finally:
        if str(site) in sys.path:
            sys.path.remove(str(site))
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]
