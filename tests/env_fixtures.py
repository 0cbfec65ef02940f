"""The CLI test environments (tests/fixtures/cli_envs), installed once per module; and a
published environment installed from the registry (:func:`published_and_installed`).

``env_site`` reaches every test through ``pytest_plugins`` in ``tests/conftest.py``: take it
as an argument, do not import it.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURE_ENVS = Path(__file__).parent / "fixtures" / "cli_envs"


@pytest.fixture(scope="module")
def env_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """echo_env, no_prompt_env and raising_env pip-installed into a folder for PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(FIXTURE_ENVS),
        ],
        check=True,
        capture_output=True,
    )
    return site


@contextlib.contextmanager
def published_and_installed(
    root: Path, package: Path, name: str, *, database_url: str | None = None
) -> Iterator[Path]:
    """``package`` (a source folder) published to a registry and artifact store under
    ``root`` (their variables set for the block; ``database_url`` instead of
    ``root/registry.db``), then ``name@latest`` installed from them into ``root/site``,
    first on ``sys.path``, and the source removed: what runs is the installed wheel."""
    from vfops.publishing import install_published, publish_environment

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VFOPS_DATABASE_URL", database_url or f"sqlite:///{root / 'registry.db'}")
        patch.setenv("VFOPS_ARTIFACTS", (root / "artifacts").as_uri())
        patch.setenv("VFOPS_HOME", str(root / "home"))
        patch.delenv("OPENAI_API_KEY", raising=False)
        publish_environment(package)
        site = root / "site"
        install_published(f"{name}@latest", target=site, no_deps=True)
        shutil.rmtree(package)
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        try:
            yield site
        finally:
            sys.path.remove(str(site))
