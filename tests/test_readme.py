"""The README's command blocks run as written (the way doctest and mkdocs projects test
their docs).

Every fenced block of README.md follows a marker saying what it is::

    <!-- readme: run -->                        run it (bash or python)
    <!-- readme: file NAME -->                  a file the reader writes (endpoints.toml)
    <!-- readme: service until "TEXT" (why) --> runs until stopped: ready once it prints TEXT
    <!-- readme: skip network (why) -->         needs the internet: a hosted API, a package index
    <!-- readme: skip gpu (why) -->
    <!-- readme: skip cluster (why) -->         a fleet of machines, a Kubernetes cluster
    <!-- readme: setup (why) -->                the set-up itself (``make demo``, ``make test``)
    <!-- readme: text (why) -->                 not commands: a diagram, a variant of a file

The blocks run in README order, each in a fresh shell (``bash -e``) with the set-up's
virtualenv active, as the README says, in a fresh copy of the checkout (git's files
only) with a home of its own (``HOME``: the registry, artifacts, MLflow and Prefect
default under it) and a virtualenv of its own that sees the test virtualenv's
packages (what ``vfops env install`` pip-installs stays in it). A ``file`` block is
written into the copy where it appears. A ``service`` block runs in a network
namespace of its own (``unshare --net``: the README's fixed ports never meet the
suite's other servers) until it prints its TEXT, then its process group is stopped; it
fails if a command before it fails (``bash -e``) or the TEXT never comes. A block that
fails fails the test with its output.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import stop_process_group

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_MARKER = re.compile(
    r"<!-- readme: (?P<kind>run|setup|text|file [\w.-]+|service until \"[^\"]+\"|"
    r"skip (?:network|gpu|cluster))(?: \((?P<why>.+)\))? -->$"
)


@dataclass(frozen=True)
class Block:
    line: int
    """The fence's line number in README.md (1-based)."""
    language: str
    kind: str
    code: str
    why: str = ""

    @property
    def ready_text(self) -> str:
        """What a ``service`` block prints once it is up."""
        return self.kind.split('"')[1]


def readme_blocks(text: str) -> list[Block]:
    """Every fenced block with the kind its marker gives (``""`` when it has none)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, language = i, lines[i][3:].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = _MARKER.match(lines[start - 1].strip()) if start > 0 else None
        kind, why = (marker.group("kind"), marker.group("why") or "") if marker else ("", "")
        code = "\n".join(lines[start + 1 : end]) + "\n"
        blocks.append(Block(start + 1, language, kind, code, why))
        i = end + 1
    return blocks


def test_every_block_says_what_it_is() -> None:
    blocks = readme_blocks(README.read_text())
    assert len(blocks) >= 10, blocks
    unmarked = [b.line for b in blocks if not b.kind]
    assert not unmarked, f"README.md blocks at lines {unmarked} need a <!-- readme: ... --> marker"
    # what is not run says why
    for block in blocks:
        if block.kind.startswith(("skip", "setup", "text")):
            assert block.why, f"README.md line {block.line - 1}: say why it is not run"


def _copy_checkout(dest: Path) -> None:
    """git's files (tracked and untracked-not-ignored), as a fresh clone would have them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)


def _overlay_venv(path: Path) -> None:
    """A virtualenv that sees the test virtualenv's packages (a ``.pth``) and has its own
    console scripts (``vfops``, ``mlflow``, ``prefect`` pointing at its own python)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    purelib = next(path.glob("lib/python3*/site-packages"))
    main_site = next(p for p in sys.path if p.endswith("site-packages"))
    (purelib / "vfops_main.pth").write_text(f"import site; site.addsitedir({main_site!r})\n")
    python = path / "bin" / "python"
    for script in Path(sys.executable).parent.iterdir():
        if script.name.startswith(("python", "activate", "pip")) or not script.is_file():
            continue
        head = script.read_bytes()[:2]
        if head != b"#!":
            continue
        lines = script.read_text().splitlines(keepends=True)
        (path / "bin" / script.name).write_text(f"#!{python}\n" + "".join(lines[1:]))
        (path / "bin" / script.name).chmod(0o755)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme") / "checkout"
    _copy_checkout(root)
    _overlay_venv(root / ".venv")
    return root


def _fresh_shell_env(root: Path) -> dict[str, str]:
    """What a new login shell has: PATH, HOME and the locale, nothing of the test's
    settings (no VFOPS_*, MLFLOW_*, PREFECT_* carried over)."""
    home = root.parent / "home"
    home.mkdir(exist_ok=True)
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TERM", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    venv_bin = str(Path(sys.executable).parent)
    # the test virtualenv is not active in a fresh shell: the block activates its own
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["HOME"] = str(home)
    return env


def _serve(block: Block, root: Path) -> str:
    """Run a service block until it prints its ready text; returns its output so far."""
    log = root.parent / f"service-{block.line}.log"
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    assert ip, "the service blocks need iproute2's ip (apt-get install iproute2)"
    script = f"{ip} link set lo up\nsource .venv/bin/activate\n" + block.code
    with log.open("w") as out:
        process = subprocess.Popen(
            ["unshare", "--net", "bash", "-e", "-o", "pipefail", "-c", script],
            cwd=root, env=_fresh_shell_env(root), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 900  # a hang catcher: waited on the text, not a guess
        while block.ready_text not in log.read_text(errors="replace"):
            assert process.poll() is None, (
                f"README.md line {block.line} exited {process.returncode} before printing "
                f"{block.ready_text!r}:\n{block.code}\n--- output\n{log.read_text()[-4000:]}"
            )
            assert time.monotonic() < deadline, f"no {block.ready_text!r}:\n{log.read_text()}"
            time.sleep(0.5)
        return log.read_text(errors="replace")
    finally:
        stop_process_group(process, grace_s=30)


def _run(block: Block, root: Path) -> subprocess.CompletedProcess[str]:
    if block.language == "python":
        # beside the checkout, not in it: a script's folder is the first place its
        # imports look
        script = root.parent / "scripts" / f"block-{block.line}.py"
        script.parent.mkdir(exist_ok=True)
        # a block that defines an environment must load: what a reader would do next
        script.write_text(
            block.code + "\nif 'load_environment' in dir():\n    load_environment()\n"
        )
        command = f"source .venv/bin/activate\npython {script}\n"
    else:
        command = "source .venv/bin/activate\n" + block.code
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", command],
        cwd=root, env=_fresh_shell_env(root), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.timeout(1500)  # every block of the README in turn, on a busy machine
def test_the_readme_blocks_run_as_written(checkout: Path) -> None:
    blocks = readme_blocks(README.read_text())
    assert sum(b.kind == "run" for b in blocks) >= 6, blocks
    served: dict[int, str] = {}
    for block in blocks:
        if block.kind.startswith("file "):
            (checkout / block.kind.split(" ", 1)[1]).write_text(block.code)
            continue
        if block.kind.startswith("service "):
            served[block.line] = _serve(block, checkout)
            continue
        if block.kind != "run":
            continue
        result = _run(block, checkout)
        assert result.returncode == 0, (
            f"README.md line {block.line} ({block.language}) exited {result.returncode}:\n"
            f"{block.code}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n"
            f"{result.stderr[-4000:]}"
        )
    # what the blocks said they did, read back from the copy
    assert (checkout / "environments" / "demo_env" / "pyproject.toml").is_file()
    assert (checkout / "models" / "tiny" / "config.json").is_file()
    assert (checkout / "exported" / "metadata.json").is_file()
    assert (checkout / ".vfops-train" / "cpu_lucky_digit" / "final").is_dir()
    assert len(served) == 2, served  # the model server and Prefect's server + worker
    assert any("nightly-eval" in out for out in served.values()), served  # deployed
