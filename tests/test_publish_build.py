"""Building a package to publish: in this interpreter when it has the build backend,
in build's isolated environments otherwise (real builds with the ``build`` frontend)."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from vfops._errors import VfopsError
from vfops.publishing import _build
from vfops.publishing._build import build_distributions
from vfops.publishing._project import read_project

ROOT = Path(__file__).resolve().parent.parent


def _copy(tmp_path: Path, requires: str | None = None, setup_cfg: str | None = None) -> Path:
    path = tmp_path / "arithmetic"
    leftovers = shutil.ignore_patterns("*.egg-info", "build", "__pycache__")
    shutil.copytree(ROOT / "environments" / "arithmetic", path, ignore=leftovers)
    if requires is not None:
        pyproject = path / "pyproject.toml"
        text = pyproject.read_text()
        pyproject.write_text(text.replace('requires = ["setuptools>=68"]', requires, 1))
        assert requires in pyproject.read_text()
    if setup_cfg is not None:
        (path / "setup.cfg").write_text(setup_cfg)
    return path


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The ``isolated`` flag of every build run."""
    seen: list[bool] = []
    run = _build._run_build

    def recording(path: Path, out_dir: Path, *, isolated: bool) -> subprocess.CompletedProcess[str]:
        seen.append(isolated)
        return run(path, out_dir, isolated=isolated)

    monkeypatch.setattr(_build, "_run_build", recording)
    return seen


def test_a_package_whose_backend_is_here_builds_without_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same files as build's isolated environments give, without installing the
    backend twice."""
    seen = _recorded(monkeypatch)
    path = _copy(tmp_path)
    built = build_distributions(read_project(path), tmp_path / "dist")
    assert seen == [False]
    isolated = _build._run_build(path, tmp_path / "isolated", isolated=True)
    assert isolated.returncode == 0, isolated.stderr
    (wheel_isolated,) = (tmp_path / "isolated").glob("*.whl")
    with zipfile.ZipFile(built.wheel) as wheel, zipfile.ZipFile(wheel_isolated) as reference:
        assert "arithmetic.py" in wheel.namelist()
        assert sorted(wheel.namelist()) == sorted(reference.namelist())
        assert wheel.read("arithmetic.py") == reference.read("arithmetic.py")
    assert built.sdist.name == next((tmp_path / "isolated").glob("*.tar.gz")).name


@pytest.mark.parametrize(
    "requires",
    [
        'requires = ["setuptools>=999"]',  # installed, but not that version
        'requires = ["setuptools>=68", "vfops-no-such-backend>=1"]',  # not installed
    ],
)
def test_a_build_requirement_this_interpreter_lacks_is_found_unmet(
    tmp_path: Path, requires: str
) -> None:
    assert _build._build_requirements_met(_copy(tmp_path)) is True
    assert _build._build_requirements_met(_copy(tmp_path / "b", requires)) is False


def test_a_backend_requirement_found_only_by_build_falls_back_to_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """setuptools asks for ``setup_requires`` only when it runs: build's own check
    finds it missing here, so the build is tried isolated (which cannot find it either:
    the error names the build)."""
    seen = _recorded(monkeypatch)
    path = _copy(tmp_path, setup_cfg="[options]\nsetup_requires = vfops-no-such-backend>=1\n")
    with pytest.raises(VfopsError, match=r"^building .*arithmetic failed: "):
        build_distributions(read_project(path), tmp_path / "dist")
    assert seen == [False, True]
