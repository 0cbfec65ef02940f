"""The built wheel, installed into a fresh virtualenv, beside a user's own ``flows`` package.

A Prefect project usually has a ``flows/`` package of its own. The wheel once installed a
second top-level package, ``flows`` (vfops' flow definitions): in such a folder the user's
package won, and loading the ``nightly-eval`` entry point failed with ``No module named
'flows.nightly'``. Now the distribution installs ``vfops`` only (its flows are
``vfops.flows``). These tests build the wheel from this checkout, pip-install it into a
new virtualenv outside any checkout and, from a folder holding its own ``flows/``, run
``vfops env init/install``, ``vfops eval`` (tracking on, the defaults) and load the
nightly flow by its entry point, as vfops, Prefect and ``vfops deploy`` find it; and, from
an empty folder, the README's forms that reach what ships inside the wheel: ``vfops demo``
(which installs nothing into the virtualenv), ``vfops env install --example``, ``vfops
train --example ... --check``.

The new virtualenv has no copy of vfops' dependencies (installing them would take
minutes and a network): a ``.pth`` file puts a folder of links to this venv's
site-packages on its path, every entry but vfops' own and the checkout's editable
installs, whose finders never run there (a ``.pth`` dir's own ``.pth`` files are not
read). vfops itself comes from the wheel only; the tests check that it does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import vfops
from vfops.testing import StubConfig, StubServer

pytestmark = pytest.mark.tracking  # `vfops eval` with the defaults: MLflow on

CHECKOUT = Path(vfops.__file__).resolve().parents[1]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    site: Path  # the new venv's site-packages, where the wheel went

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def vfops(self) -> Path:
        return self.venv / "bin" / "vfops"


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _source_files() -> list[str]:
    """The checkout's files as a clone would have them, plus new ones not ignored."""
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], CHECKOUT)
    return [name for name in listed.splitlines() if (CHECKOUT / name).is_file()]


def _build_wheel(tmp: Path) -> Path:
    """``python -m build --wheel`` on a copy of the checkout (which gets no build/ or
    egg-info of it), with this venv's setuptools (no network)."""
    source = tmp / "source"
    for name in _source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(CHECKOUT / name, source / name)
    dist = tmp / "dist"
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)]
    _run(command, cwd=source)
    (wheel,) = dist.glob("vfops-*.whl")
    return wheel


def _is_editable(dist_info: Path) -> bool:
    direct_url = dist_info / "direct_url.json"
    if not direct_url.is_file():
        return False
    return bool(json.loads(direct_url.read_text()).get("dir_info", {}).get("editable"))


def _link_dependencies(into: Path) -> None:
    """Links to this venv's installed packages, but none of vfops (its package and the
    editable install's metadata and finder) and none of the checkout's editable
    environments (their metadata would name modules that cannot load there)."""
    into.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name
        if name.startswith(("vfops", "__editable__")) or name.endswith(".pth"):
            continue
        if name.endswith(".dist-info") and _is_editable(entry):
            continue
        (into / name).symlink_to(entry.resolve())


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(tmp)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = str(venv / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", purelib], tmp).strip())
    # inside the venv's prefix, as pip would put them: dill (datasets' fingerprints)
    # pickles a module outside sys.prefix by value, and pyarrow's cannot be
    _link_dependencies(venv / "dependencies")
    (site / "dependencies.pth").write_text(f"{venv / 'dependencies'}\n")
    # pip itself is one of the linked packages: it installs into the new venv
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], tmp)
    return Installed(wheel=wheel, venv=venv, site=site)


def test_the_wheel_holds_vfops_only(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
        (record,) = [name for name in names if name.endswith(".dist-info/RECORD")]
        recorded = [line.split(",")[0] for line in wheel.read(record).decode().splitlines()]
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        declared = wheel.read(entry_points).decode()
    dist_info = f"vfops-{vfops.__version__}.dist-info"
    assert {name.split("/")[0] for name in names} == {"vfops", dist_info}
    assert {name.split("/")[0] for name in recorded if name} == {"vfops", dist_info}
    assert "vfops/flows/nightly.py" in names
    # every flow by its module inside vfops
    section = declared.split("[vfops.flows]", 1)[1].split("\n[", 1)[0]
    flows = dict(line.split(" = ") for line in section.strip().splitlines())
    assert flows["nightly-eval"] == "vfops.flows.nightly:nightly_eval"
    assert len(flows) >= 8 and all(v.startswith("vfops.flows.") for v in flows.values())


def test_the_wheel_ships_every_example_file(installed: Installed) -> None:
    """The examples' files in git (environments/NAME and configs/train/NAME.toml link to
    them) are package data: none left out by the globs of pyproject.toml."""
    examples = "vfops/templates/examples/"
    in_git = {name for name in _source_files() if name.startswith(examples)}
    with zipfile.ZipFile(installed.wheel) as wheel:
        shipped = {name for name in wheel.namelist() if name.startswith(examples)}
    assert shipped == in_git
    assert f"{examples}environments/arithmetic/arithmetic.py" in shipped
    assert f"{examples}train/cpu_lucky_digit.toml" in shipped


FLOW_CHECK = """
import importlib.metadata as metadata, inspect, json
from pathlib import Path
import vfops
from vfops.orchestration import flow_ref, load_flow

entry_point = {ep.name: ep for ep in metadata.entry_points(group="vfops.flows")}["nightly-eval"]
flow = entry_point.load()
ref = flow_ref("nightly-eval")  # what `vfops deploy` registers: root + entrypoint
from prefect.flows import load_flow_from_entrypoint  # and what a worker then loads
on_worker = load_flow_from_entrypoint(str(ref.root / ref.entrypoint))
import flows.nightly  # the user's package is still theirs
print(json.dumps({
    "vfops": str(Path(vfops.__file__).resolve()),
    "distribution": str(Path(metadata.distribution("vfops").locate_file("")).resolve()),
    "flow": [type(flow).__name__, flow.name, str(Path(inspect.getfile(flow.fn)).resolve())],
    "load_flow": load_flow("nightly-eval") is flow,
    "root": str(ref.root),
    "entrypoint": ref.entrypoint,
    "on_worker": on_worker.name,
    "users_flows": [str(Path(flows.nightly.__file__).resolve()), flows.nightly.MINE],
}))
"""


def _user_env(installed: Installed, tmp_path: Path) -> dict[str, str]:
    """A shell with the new virtualenv active: nothing of the checkout, vfops' defaults."""
    env = {
        **os.environ,
        "VFOPS_HOME": str(tmp_path / "home"),
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PATH": f"{installed.venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(installed.venv),
    }
    for name in ("PYTHONPATH", "VFOPS_TRACKING", "OPENAI_API_KEY"):
        env.pop(name, None)
    return env


def test_eval_and_the_nightly_flow_beside_a_users_flows_package(
    installed: Installed, tmp_path: Path
) -> None:
    project = tmp_path / "project"  # a user's Prefect project: its own flows/ package
    (project / "flows").mkdir(parents=True)
    (project / "flows" / "__init__.py").write_text('"""My own flows."""\n')
    (project / "flows" / "nightly.py").write_text("MINE = True\n")
    env = _user_env(installed, tmp_path)

    vfops_cli = str(installed.vfops)
    _run([vfops_cli, "env", "init", "demo_env"], project, env)
    _run([vfops_cli, "env", "install", "environments/demo_env", "--no-deps"], project, env)
    with StubServer(StubConfig(reply_mode="arithmetic")) as server:
        model = ["-m", "stub-model", "-b", server.base_url]
        size = ["-n", "5", "-r", "2", "-o", str(tmp_path / "out")]
        out = _run([vfops_cli, "eval", "demo_env", *model, *size], project, env)
        assert server.stats["ok"] == 10
    (run_dir,) = (tmp_path / "out").glob("evals/demo_env--stub-model/*")
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "completed"
    assert len((run_dir / "results.jsonl").read_text().splitlines()) == 10
    # recorded with the defaults: MLflow too
    assert metadata["mlflow_run_id"] and f"mlflow run: {metadata['mlflow_run_id']}" in out

    found = json.loads(_run([str(installed.python), "-c", FLOW_CHECK], project, env))
    site = str(installed.site.resolve())
    # vfops is the wheel's, in the new venv (the checkout's editable install is not seen)
    assert found["vfops"] == f"{site}/vfops/__init__.py"
    assert found["distribution"] == site
    assert found["flow"] == ["Flow", "nightly-eval", f"{site}/vfops/flows/nightly.py"]
    assert found["load_flow"]
    assert (found["root"], found["entrypoint"]) == (site, "vfops/flows/nightly.py:nightly_eval")
    assert found["on_worker"] == "nightly-eval"
    assert found["users_flows"] == [str((project / "flows" / "nightly.py").resolve()), True]


def _listing(folder: Path) -> list[str]:
    """Every file and folder under ``folder`` (links not followed), relative."""
    return sorted(
        str((Path(top) / name).relative_to(folder))
        for top, dirs, files in os.walk(folder)
        for name in (*dirs, *files)
    )


def _imports(installed: Installed, module: str, env: dict[str, str], cwd: Path) -> str | None:
    """Where the new virtualenv's python finds ``module`` (None: nowhere)."""
    code = f"import importlib.util as u; s = u.find_spec({module!r}); print(s and s.origin)"
    found = _run([str(installed.python), "-c", code], cwd, env).strip()
    return None if found == "None" else found


def test_the_demo_installs_nothing_into_the_virtualenv(
    installed: Installed, tmp_path: Path
) -> None:
    """The README: everything of ``vfops demo`` lives under .vfops-demo/. It publishes
    lucky_digit and loads it by name; the wheel it installs goes into .vfops-demo/, and
    the virtualenv's site-packages stays as it was (it once pip-installed it there)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = _user_env(installed, tmp_path)
    # nothing installs it before (test_the_examples_reach_an_empty_folder removes its own)
    assert _imports(installed, "lucky_digit", env, empty) is None
    before = _listing(installed.site)
    # the whole loop, small: 2 held-out examples, 1 GRPO step, no nights
    size = ["--steps", "1", "--eval-examples", "2", "--no-nightly"]
    out = _run([str(installed.vfops), "demo", *size], empty, env)
    assert "held-out reward" in out and "champion: version" in out
    assert _listing(installed.site) == before
    assert _imports(installed, "lucky_digit", env, empty) is None
    private = empty / ".vfops-demo" / "site-packages"
    assert (private / "lucky_digit.py").is_file()
    assert sorted(p.name for p in empty.iterdir()) == [".vfops-demo"]


def test_the_examples_reach_an_empty_folder(installed: Installed, tmp_path: Path) -> None:
    """The README's forms outside a checkout: the example environments and training
    configs ship inside the wheel and are reached by name."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = _user_env(installed, tmp_path)
    vfops_cli = str(installed.vfops)
    # not installed yet: the one line says how to get it from the wheel
    missing = subprocess.run(
        [vfops_cli, "eval", "arithmetic", "-m", "m", "-b", "http://127.0.0.1:9", "--no-tracking"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    hint = "install it with: vfops env install --example arithmetic"
    assert missing.stderr.strip().endswith(hint)
    try:
        for name in ("arithmetic", "lucky_digit"):
            out = _run([vfops_cli, "env", "install", "--example", name, "--no-deps"], empty, env)
            assert out.strip() == f"installed the example {name}"
            # installed as a copy: the wheel's own folder stays as it was
            assert str(installed.site) in str(_imports(installed, name, env, empty))
        with StubServer(StubConfig(reply_mode="arithmetic")) as server:
            model = ["-m", "stub-model", "-b", server.base_url, "--no-tracking"]
            size = ["-n", "2", "-r", "1", "-o", str(tmp_path / "out")]
            _run([vfops_cli, "eval", "arithmetic", *model, *size], empty, env)
            assert server.stats["ok"] == 2
        (run_dir,) = (tmp_path / "out").glob("evals/arithmetic--stub-model/*")
        assert json.loads((run_dir / "metadata.json").read_text())["status"] == "completed"

        check = [vfops_cli, "train", "--example", "cpu_lucky_digit", "--check"]
        assert _run(check, empty, env).strip() == (
            "example cpu_lucky_digit: ok (lucky_digit, 200 steps)"
        )
        # a bad name: one line naming the shipped ones, exit 2, nothing written
        bad = subprocess.run(
            [vfops_cli, "train", "--example", "cpu_lucky", "--check"],
            cwd=empty, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert (bad.returncode, bad.stdout) == (2, "")
        assert bad.stderr.strip() == (
            "error: no example training config named 'cpu_lucky'; pass --example with one "
            "of: cpu_lora_example, cpu_lucky_digit, cpu_smollm2_reverse_text, "
            "cpu_smollm2_reverse_text_full"
        )
        assert sorted(p.name for p in empty.iterdir()) == []
    finally:  # the fixture's virtualenv is shared: the demo test needs it without them
        pip = [str(installed.python), "-m", "pip", "uninstall", "--quiet", "--yes"]
        _run([*pip, "arithmetic", "lucky_digit"], tmp_path, env)
