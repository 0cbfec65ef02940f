"""The registry's run store (:class:`vfops.registry.RunStore`): an eval run's whole life
through named operations, in a worker thread and in a registry process, on SQLite and
PostgreSQL; and the boundary it draws: nothing outside ``vfops/registry`` imports
SQLAlchemy at run time, and the service runs only the operations it names."""

from __future__ import annotations

import ast
import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.registry_fixtures import DIALECTS, database_url, make_record
from vfops._errors import VfopsError
from vfops._lease import LeaseLostError, LeaseOwner
from vfops.registry import (
    OPERATIONS,
    InstalledCode,
    ProcessService,
    RegistryService,
    RunOpening,
    RunStore,
    ThreadService,
    get_engine,
)

ROOT = Path(__file__).resolve().parent.parent
CODE = InstalledCode("arithmetic", "c" * 64, "local+cccccccccccc")


@pytest.fixture(params=DIALECTS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path)


def _opening(tmp_path: Path, run_id: str, **changes: object) -> RunOpening:
    fields: dict[str, object] = {
        "code": CODE,
        "identity": {"env_name": "arithmetic", "model": "m", "num_examples": 2},
        "model": "m",
        "base_url": None,
        "sampling_args": {"temperature": 0.0},
        "env_args": {},
        "num_examples": 2,
        "rollouts_per_example": 1,
        "tags": ["t"],
        "run_id": run_id,
        "run_dir": str(tmp_path / "runs" / run_id),
        "output_root": str(tmp_path / "runs"),
        "pid": os.getpid(),
    }
    fields.update(changes)
    return RunOpening(**fields)  # type: ignore[arg-type]


async def _life(store: RunStore, tmp_path: Path) -> None:
    opened = await store.open(_opening(tmp_path, "a" * 32))
    assert (opened.action, opened.run_id, opened.version) == (
        "created",
        "a" * 32,
        "local+cccccccccccc",
    )
    assert opened.lease is not None and opened.version_id is None
    lease = opened.lease
    assert await store.insert(opened.run_id, [make_record(0, 0), make_record(1, 0)], lease) == 2
    assert await store.insert(opened.run_id, [make_record(0, 0)], lease) == 0  # idempotent
    assert await store.renew_lease(opened.run_id, lease)
    await store.hold_lease(opened.run_id, lease)
    # another process's lease cannot write the run while this one holds it
    intruder = LeaseOwner.for_process(os.getpid() + 1_000_000)
    with pytest.raises(LeaseLostError):
        await store.insert(opened.run_id, [make_record(2, 0)], intruder)
    await store.record_end(opened.run_id, "completed", {"reward_mean": 0.5}, lease)
    await store.link_mlflow(opened.run_id, "mlflow-1")
    await store.release_lease(opened.run_id, lease)
    record = await store.record(opened.run_id)
    assert record["status"] == "completed" and record["mlflow_run_id"] == "mlflow-1"
    assert record["tags"] == ["t"] and record["published_datasets"] is None
    summary = await store.summary(opened.run_id)
    assert summary.rollouts == 2
    found = await store.rollouts(opened.run_id, {(1, 0), (5, 5)})
    assert [r.key for r in found] == [(1, 0)]
    # the same configuration, asked to reuse: the completed run, no lease taken
    reused = await store.open(_opening(tmp_path, "b" * 32, existing="reuse"))
    assert (reused.action, reused.run_id, reused.lease) == ("reused", "a" * 32, None)
    # resumed by id: a different configuration is refused, naming the run
    with pytest.raises(VfopsError, match=r"cannot resume run a{32}"):
        await store.open(
            _opening(
                tmp_path,
                "c" * 32,
                resume="a" * 32,
                resume_run_id="a" * 32,
                identity={"env_name": "arithmetic", "model": "other"},
            )
        )
    resumed = await store.open(
        _opening(tmp_path, "c" * 32, resume="a" * 32, resume_run_id="a" * 32)
    )
    assert resumed.action == "resumed" and resumed.done == {(0, 0), (1, 0)}


def test_a_run_s_life_in_a_worker_thread(url: str, tmp_path: Path) -> None:
    async def main() -> None:
        store = RunStore(ThreadService(get_engine(url)))
        try:
            await _life(store, tmp_path)
        finally:
            await store.aclose()

    asyncio.run(main())


def test_a_run_s_life_in_a_registry_process(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    get_engine(url)  # the schema, created here (the child finds it)
    monkeypatch.setenv("VFOPS_DATABASE_URL", url)

    async def main() -> None:
        store = RunStore(await ProcessService.start())
        try:
            await _life(store, tmp_path)
        finally:
            await store.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("where", ["thread", "process"])
def test_the_service_runs_only_named_operations(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    monkeypatch.setenv("VFOPS_DATABASE_URL", url)

    async def main() -> None:
        service: RegistryService
        if where == "thread":
            service = ThreadService(get_engine(url))
        else:
            service = await ProcessService.start()
        try:
            with pytest.raises(VfopsError, match=r"no registry operation 'os\.system'"):
                await service.call("os.system", "true")
            # a function is not an operation's name: refused the same way, not run
            with pytest.raises(VfopsError, match="no registry operation"):
                await service.call(print, "ran")  # type: ignore[arg-type]
            # the service still answers after a refusal
            assert await service.call("pushback.state", "http://x/v1 m") == (0, None, None)
        finally:
            await service.aclose()

    asyncio.run(main())
    assert sorted(OPERATIONS) == sorted(
        [
            "run.open",
            "run.insert",
            "run.renew_lease",
            "run.hold_lease",
            "run.release_lease",
            "run.record_end",
            "run.link_mlflow",
            "run.record",
            "run.summary",
            "run.rollouts",
            "cost.set_caps",
            "cost.reserve",
            "cost.settle",
            "pushback.state",
            "pushback.bump",
        ]
    )


def runtime_imports_of(source: str, package: str) -> list[int]:
    """Lines of ``source`` that import ``package`` when run (``if TYPE_CHECKING:``
    blocks left out; imports inside functions counted)."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    lines = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == package or name.startswith(package + ".") for name in names):
            lines.append(node.lineno)
    return lines


def test_runtime_imports_of_sees_what_runs() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import sqlalchemy.orm\n"
        "if TYPE_CHECKING:\n"
        "    from sqlalchemy import Engine\n"
        "def f():\n"
        "    from sqlalchemy.exc import OperationalError\n"
        "import sqlalchemy_utils\n"
    )
    assert runtime_imports_of(source, "sqlalchemy") == [2, 6]


def test_only_the_registry_imports_sqlalchemy_at_run_time() -> None:
    registry = ROOT / "vfops" / "registry"
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "vfops").rglob("*.py"))
        if registry not in path.parents
        for line in runtime_imports_of(path.read_text(), "sqlalchemy")
    ]
    assert found == [], "SQLAlchemy outside vfops/registry (use a registry function): " + str(found)
