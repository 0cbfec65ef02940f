from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

# Nothing in the test suite may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Never touch the developer's ~/.vfops: every test session gets its own home
# (subprocesses inherit it).
os.environ["VFOPS_HOME"] = tempfile.mkdtemp(prefix="vfops-test-home-")
os.environ.pop("VFOPS_DATABASE_URL", None)
os.environ.pop("VFOPS_ARTIFACTS", None)

# Shared fixtures, available to every test without importing them (importing a fixture
# by name "redefines" it as the test's argument, which linters flag). s3 before mlflow:
# mlflow_fixtures imports s3_fixtures, which must be registered (for assertion
# rewriting) before anything imports it.
pytest_plugins = [
    "tests.strict_skips",
    "tests.s3_fixtures",
    "tests.mlflow_fixtures",
    "tests.prefect_fixtures",
    "tests.env_fixtures",
]

# `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadfile`): most
# tests wait on subprocesses and servers, so two at a time nearly halve the wall time
# on two cores. Each file stays on one worker (its module fixtures start once), and
# the files that train or run a model on the CPU go to one worker together, so two
# torch workloads never compete for the cores (their timeouts assume one at a time).
# They go first: the longest chain, started last, would be the tail. (xdist's own
# `loadgroup` cannot do this here: it marks groups by editing node ids, which pytest 9.2
# no longer reads, so grouped tests were spread over both workers.)
TORCH_HEAVY_FILES = frozenset(
    {
        "test_demo.py",
        "test_training_recipe.py",
        "test_training_cli.py",
        "test_training_run.py",
        "test_training_flow.py",
        "test_training.py",
        "test_local_model.py",
    }
)
TORCH_HEAVY_SCOPE = "torch-heavy"


def _scope_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return TORCH_HEAVY_SCOPE if path.rsplit("/", 1)[-1] in TORCH_HEAVY_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the torch-heavy files as one scope (one worker)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTorchScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of(nodeid)

    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own scheduler for any other mode
    return FileOrTorchScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _scope_of(item.nodeid) != TORCH_HEAVY_SCOPE)  # stable
