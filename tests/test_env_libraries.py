"""A third environment library plugs in through the documented protocol alone.

``toylib`` is a library of arithmetic quizzes that knows nothing of vfops but for its
plug-in (``toylib.LIBRARY``, an :class:`~vfops.envs.EnvironmentLibrary`), registered in
the ``vfops.environment_libraries`` entry points; ``toy_sums`` is an environment
written for it, declared in toylib's own entry-point group. Both are "installed" as
``importlib.metadata`` sees an install: a package and its ``.dist-info`` (``METADATA``,
``entry_points.txt``) on ``sys.path``. No file of vfops names either: vfops finds,
loads, evaluates, lists, describes and reads the source of the environment through
the library.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vfops._errors import VfopsError
from vfops.clients import ScriptedClient
from vfops.envs import (
    LIBRARY_GROUP,
    SingleTurnEnv,
    environment_libraries,
    find_environment,
    installed_environments,
    load_environment,
)
from vfops.evaluation import EvalRequest, RunOptions, evaluate_async

TOYLIB = '''
"""toylib: quizzes of (question, answer) pairs, and its vfops plug-in."""

from dataclasses import dataclass

from vfops.envs import EnvironmentLibrary, SingleTurnEnv
from vfops.rubrics import Rubric


@dataclass
class Quiz:
    questions: list


def exact(completion, answer):
    return 1.0 if completion[-1]["content"] == answer else 0.0


class ToyLibrary(EnvironmentLibrary):
    name = "toylib"

    def environments(self, package):
        return dict(package.entry_points.get("toylib.quizzes") or {})

    def build(self, factory, name, /, **env_args):
        quiz = factory(**env_args)
        rows = [{"question": q, "answer": a} for q, a in quiz.questions]
        return SingleTurnEnv(eval_dataset=rows, rubric=Rubric(funcs=[exact]), name=name)


LIBRARY = ToyLibrary()
'''

TOY_SUMS = """
from toylib import Quiz


def load_environment(n=3):
    return Quiz([(f"{i}+{i + 1}", str(2 * i + 1)) for i in range(n)])
"""


def _dist_info(site: Path, name: str, version: str, entry_points: str, requires: str = "") -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires:
        metadata += f"Requires-Dist: {requires}\n"
    (info / "METADATA").write_text(metadata)
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    (info / "top_level.txt").write_text(name.replace("-", "_") + "\n")


def _forget(*modules: str) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in modules]:
        del sys.modules[name]


@pytest.fixture
def toy_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """toylib and toy_sums installed into a folder on ``sys.path``."""
    site = tmp_path / "site"
    (site / "toylib").mkdir(parents=True)
    (site / "toylib" / "__init__.py").write_text(TOYLIB)
    _dist_info(site, "toylib", "0.2.0", f"[{LIBRARY_GROUP}]\ntoylib = toylib:LIBRARY\n")
    (site / "toy_sums").mkdir()
    (site / "toy_sums" / "__init__.py").write_text(TOY_SUMS)
    _dist_info(
        site,
        "toy-sums",
        "0.1.0",
        "[toylib.quizzes]\ntoy_sums = toy_sums:load_environment\n",
        requires="toylib>=0.2",
    )
    monkeypatch.syspath_prepend(str(site))  # and importlib.invalidate_caches()
    environment_libraries.cache_clear()  # the libraries are read once per process
    yield site
    monkeypatch.undo()
    importlib.invalidate_caches()
    environment_libraries.cache_clear()
    _forget("toylib", "toy_sums")


def test_a_third_library_is_found_by_its_entry_point_and_loads_its_environment(
    toy_site: Path,
) -> None:
    names = [library.name for library in environment_libraries()]
    assert names[0] == "vfops" and "toylib" in names  # vfops's own is asked first
    entry = installed_environments()["toy_sums"]
    assert (entry.library, entry.version, entry.module) == ("toylib", "0.1.0", "toy_sums")
    found = find_environment("toy-sums")
    assert found is not None and (found.name, found.library) == ("toy_sums", "toylib")
    env = load_environment("toy_sums", n=4)
    assert isinstance(env, SingleTurnEnv) and env.name == "toy_sums"
    assert env.eval_size() == 4
    assert env.get_eval_dataset()[1]["answer"] == "3"


def test_an_evaluation_of_it_runs_end_to_end(toy_site: Path, tmp_path: Path) -> None:
    def add(messages: list[dict[str, str]], tools: object) -> str:
        left, right = messages[-1]["content"].split("+")
        return str(int(left) + int(right))

    request = EvalRequest(
        env_name="toy_sums", model="scripted", num_examples=3, rollouts_per_example=2,
        max_concurrent=2, env_args={"n": 3},
    )  # fmt: skip
    result = asyncio.run(
        evaluate_async(
            request,
            RunOptions(output_root=tmp_path / "runs", registry=False),
            client=ScriptedClient(add),
        )
    )
    assert result.status == "completed", result.error
    assert result.summary.reward.mean == 1.0 and result.summary.rollouts == 6


def test_its_provenance_records_the_library_and_its_version(toy_site: Path) -> None:
    from vfops.publishing import inspect_installed

    installed = inspect_installed("toy_sums")
    assert (installed.library, installed.library_version) == ("toylib", "0.2.0")
    assert installed.distribution_version == "0.1.0"


def test_env_list_shows_it_with_its_library(
    toy_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vfops.cli._env import app

    monkeypatch.setenv("VFOPS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VFOPS_DATABASE_URL", raising=False)
    result = CliRunner().invoke(app, ["list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.output.splitlines() if "toy_sums" in line]
    assert re.split(r"\s*│\s*", row.strip("│ ")) == ["toy_sums", "toylib", "-", "0", "0.1.0"]


def test_publishing_reads_its_source_folder_through_the_library(
    toy_site: Path, tmp_path: Path
) -> None:
    from vfops.publishing import read_project
    from vfops.publishing._build import load_from_source

    source = tmp_path / "toy-sums-src"
    (source / "toy_sums_src").mkdir(parents=True)
    (source / "toy_sums_src" / "__init__.py").write_text(TOY_SUMS)
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [project]
            name = "toy-sums-src"
            version = "0.1.0"
            dependencies = ["toylib>=0.2"]

            [project.entry-points."toylib.quizzes"]
            toy_sums_src = "toy_sums_src:load_environment"
            """
        )
    )
    project = read_project(source)
    assert (project.library, project.env_name) == ("toylib", "toy_sums_src")
    env = load_from_source(project)
    assert sorted(env.splits()) == ["eval"] and len(env.splits()["eval"]) == 3


def test_a_library_that_fails_to_load_is_one_line_naming_it(
    toy_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (toy_site / "toylib" / "__init__.py").write_text("import toylib_missing_dependency\n")
    with pytest.raises(VfopsError) as caught:
        environment_libraries()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("environment library 'toylib' (toylib:LIBRARY, from toylib 0.2.0)")
    assert "ModuleNotFoundError: No module named 'toylib_missing_dependency'" in message
    assert message.endswith("fix or uninstall that package")
