"""Which packages are verifiers v1 taskset packages: the one rule (vfops.adapters._v1_packages)
behind ``vfops env list``, ``vfops eval`` and ``vfops env publish``, on a package that
declares only ``datasets`` (``tests/verifiers_v1_envs/v1_datasets_only``, installed editable
into the v1 venv by ``make setup-v1``), the shape of upstream's reverse_text and gsm8k.

Run in .venv-v1 (``VFOPS_TEST_V1=1 .venv-v1/bin/pytest tests/v1/test_v1_packages.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from vfops.adapters._v1_packages import MAX_SCANNED, taskset_module
from vfops.publishing import read_project
from vfops.testing import StubConfig, StubServer

VFOPS = str(Path(sys.executable).parent / "vfops")
SOURCE = Path(__file__).resolve().parents[1] / "verifiers_v1_envs" / "v1_datasets_only"
NAME = "v1_datasets_only"


def vfops(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [VFOPS, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def listed(env: dict[str, str], cwd: Path) -> dict[str, list[str]]:
    """``vfops env list``'s rows: name -> its cells."""
    done = vfops(["env", "list"], env, cwd)
    assert done.returncode == 0, done.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in done.stdout.splitlines()]
    return {row[0]: row for row in rows if row}


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A registry (SQLite) and an artifact store of the test's own."""
    env = dict(os.environ)
    env["VFOPS_HOME"] = str(tmp_path / "home")
    env["VFOPS_DATABASE_URL"] = f"sqlite:///{tmp_path / 'registry.db'}"
    env["VFOPS_ARTIFACTS"] = (tmp_path / "artifacts").as_uri()
    return env


@pytest.fixture(scope="module")
def stub() -> Iterator[StubServer]:
    with StubServer(StubConfig(reply_mode="echo_answer")) as server:  # echoes ANSWER_HINT
        yield server


def write_package(root: Path, name: str, files: dict[str, str], deps: str = '"datasets"') -> Path:
    """A source folder: a pyproject that declares ``deps`` and the given module files."""
    folder = root / name
    (folder / name.replace("-", "_")).mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = [{deps}]\n'
    )
    for relpath, text in files.items():
        path = folder / name.replace("-", "_") / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


TASKSET = """
    import verifiers.v1 as vf

    class Plain(vf.Taskset[vf.Task, vf.TasksetConfig]):
        def load(self):
            return []
"""


def claimed(folder: Path) -> str | None:
    from vfops.publishing._project import _package

    return taskset_module(_package({"project": {"name": folder.name}}, folder, ["datasets"]))


def test_the_rule_reads_the_source_not_the_metadata(tmp_path: Path) -> None:
    """Claimed: the module named like the package reaches ``import verifiers`` through
    its own imports (absolute, relative, ``from . import``); not claimed: no ``__all__``,
    no verifiers import, or a verifiers import that only a comment or a string makes."""
    absolute = write_package(
        tmp_path, "abs-taskset",
        {"__init__.py": "from abs_taskset.core import Plain\n__all__ = ['Plain']\n",
         "core.py": TASKSET},
    )  # fmt: skip
    relative = write_package(
        tmp_path, "rel_taskset",
        {"__init__.py": "from .sub.deep import Plain\n__all__ = ['Plain']\n",
         "sub/__init__.py": "", "sub/deep.py": TASKSET},
    )  # fmt: skip
    by_name = write_package(
        tmp_path, "named",
        {"__init__.py": "from . import impl\nPlain = impl.Plain\n__all__ = ['Plain']\n",
         "impl.py": TASKSET},
    )  # fmt: skip
    assert claimed(absolute) == "abs_taskset"
    assert claimed(relative) == "rel_taskset"
    assert claimed(by_name) == "named"

    no_all = write_package(tmp_path, "no_all", {"__init__.py": TASKSET})
    unrelated = write_package(
        tmp_path, "unrelated",
        {"__init__.py": "from unrelated.core import f\n__all__ = ['f']\n",
         "core.py": "# import verifiers\nDOC = '''\nimport verifiers\n'''\ndef f(): ...\n"},
    )  # fmt: skip
    assert claimed(no_all) is None
    assert claimed(unrelated) is None


def test_a_large_library_is_read_no_further_than_its_budget(tmp_path: Path) -> None:
    """A package whose verifiers import lies past :data:`MAX_SCANNED` files is not claimed
    (the bound that keeps ``vfops env list`` at ~0.1 s for the whole venv)."""
    chain = {"__init__.py": "from big.m0 import Plain\n__all__ = ['Plain']\n"}
    for index in range(MAX_SCANNED):
        chain[f"m{index}.py"] = f"from big.m{index + 1} import Plain\n"
    chain[f"m{MAX_SCANNED}.py"] = TASKSET
    assert claimed(write_package(tmp_path, "big", chain)) is None
    del chain[f"m{MAX_SCANNED - 1}.py"], chain[f"m{MAX_SCANNED}.py"]
    chain[f"m{MAX_SCANNED - 2}.py"] = TASKSET
    assert claimed(write_package(tmp_path / "near", "big", chain)) == "big"


def test_env_list_shows_a_datasets_only_taskset_with_its_library(
    home: dict[str, str], tmp_path: Path
) -> None:
    rows = listed(home, tmp_path)
    assert rows[NAME][1:] == ["verifiers-v1", "-", "0", "0.1.0"], rows.get(NAME)
    assert rows["v1_arith"][1] == "verifiers-v1"  # one that requires verifiers: as before


def test_listing_imports_no_package() -> None:
    """The rule reads source: listing every installed taskset imports none of them, nor
    verifiers or datasets (seconds, and their code would run)."""
    script = (
        "import sys\n"
        "from vfops.adapters import VERIFIERS_V1\n"
        "names = {entry.name for entry in VERIFIERS_V1.installed()}\n"
        f"assert {NAME!r} in names, names\n"
        f"loaded = {{'verifiers', 'datasets', {NAME!r}, 'v1_arith'}} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_publish_refuses_a_package_that_holds_no_taskset_in_one_line(
    home: dict[str, str], tmp_path: Path
) -> None:
    folder = write_package(tmp_path, "no_taskset", {"__init__.py": "__all__ = []\n"})
    done = vfops(["env", "publish", str(folder)], home, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "exactly one entry point" in line and "v1 taskset" in line, line
    assert not (tmp_path / "registry.db").exists() or "no_taskset" not in listed(home, tmp_path)


def test_published_installed_listed_and_evaluated(
    home: dict[str, str], stub: StubServer, tmp_path: Path
) -> None:
    """Published (wheel, sdist, dataset snapshots, a registry row), installed from the
    registry as a plain wheel into a folder first on the path, listed from there and
    evaluated: the run is the published version's."""
    assert read_project(SOURCE).library == "verifiers-v1"
    published = vfops(["env", "publish", str(SOURCE)], home, tmp_path)
    assert published.returncode == 0, published.stderr + published.stdout
    assert f"published {NAME}@0.1.0" in published.stdout, published.stdout
    assert "train: 6 rows" in published.stdout

    site = tmp_path / "site"
    installed = vfops(["env", "install", f"{NAME}@0.1.0", "--target", str(site), "--no-deps"],
                      home, tmp_path)  # fmt: skip
    assert installed.returncode == 0, installed.stderr + installed.stdout
    env = {**home, "PYTHONPATH": str(site)}
    assert listed(env, tmp_path)[NAME][1:] == ["verifiers-v1", "0.1.0", "1", "0.1.0"]

    done = vfops(
        ["eval", NAME, "-m", "stub-model", "-b", stub.base_url, "-n", "6", "-r", "1",
         "-o", str(tmp_path / "out"), "--no-tracking"],
        env, tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    (results,) = (tmp_path / "out").rglob("results.jsonl")
    rewards = sorted(orjson.loads(line)["reward"] for line in results.read_bytes().splitlines())
    assert rewards == [0.0] + [1.0] * 5  # one hint is wrong
    run_id = re.search(r"run: (\w+)", done.stdout).group(1)  # type: ignore[union-attr]
    shown = vfops(["runs", "show", run_id], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    # the published row's version, not local+<code hash>
    assert re.search(r"env_version\s+│ 0\.1\.0 ", shown.stdout), shown.stdout[:1500]
