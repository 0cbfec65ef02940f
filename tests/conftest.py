from __future__ import annotations

import os
import tempfile

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
