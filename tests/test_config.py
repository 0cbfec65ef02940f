"""The shared config base (:mod:`vfops._config`): one loader, every problem named at once.

The loader on a small model of its own, then ``budgets.toml`` and ``endpoints.toml``
(through ``vfops eval -e``); the training, sweep and nightly files have theirs in
test_training_config.py, test_sweeps.py and test_nightly.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from pydantic import Field, ValidationError

from vfops._config import ConfigError, ConfigModel, RelativePath, load_toml, read_toml
from vfops._errors import VfopsError
from vfops.budget import Budget, budget_for, load_budgets

REPO = Path(__file__).resolve().parent.parent


class Limits(ConfigModel):
    size: int = Field(default=1, ge=1, description="How many.")
    mode: Literal["fast", "slow"] = Field(default="fast", description="How.")


class Item(ConfigModel):
    unknown_key_hints: ClassVar[dict[str, str]] = {"secret": "secrets never go in this file"}
    name: str = Field(min_length=1, description="Its name.")


class Toy(ConfigModel):
    title: str = Field(description="A required key.")
    folder: RelativePath = Field(default="data", description="Relative to the file.")
    limits: Limits = Field(default_factory=Limits, description="A table.")
    item: list[Item] = Field(default_factory=list, description="An array of tables.")
    named: dict[str, Limits] = Field(default_factory=dict, description="A table of tables.")


def _toml(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "toy.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _lines(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_toml(path, Toy)
    return str(info.value).splitlines()


def test_a_good_file_loads_with_defaults_and_paths_resolved(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'title = "t"\n[[item]]\nname = "a"\n[named.x]\nsize = 3\n')
    toy = load_toml(path, Toy)
    assert toy.folder == str(tmp_path / "data")
    assert (toy.limits.size, toy.item[0].name, toy.named["x"].size) == (1, "a", 3)
    assert Toy.field_help() == {
        "title": "A required key.",
        "folder": "Relative to the file.",
        "limits.size": "How many.",
        "limits.mode": "How.",
        "item": "An array of tables.",
        "named": "A table of tables.",
    }


def test_unreadable_files_are_one_line(tmp_path: Path) -> None:
    assert _lines(_toml(tmp_path, b'title = "caf\xc3"\n')) == [
        f"{tmp_path / 'toy.toml'}: not UTF-8 text (byte 0xc3 at offset 12); save it as UTF-8"
    ]
    assert _lines(_toml(tmp_path, 'title = "t"\n[limits\n')) == [
        f"{tmp_path / 'toy.toml'}: invalid TOML at line 2, column 8: Expected ']' at the end "
        "of a table declaration; fix the syntax"
    ]
    assert _lines(_toml(tmp_path, "title = ")) == [
        f"{tmp_path / 'toy.toml'}: invalid TOML at the end of the file: Invalid value; "
        "fix the syntax"
    ]
    with pytest.raises(ConfigError, match=r"nope\.toml: file not found; create it"):
        load_toml(tmp_path / "nope.toml", Toy)
    with pytest.raises(ConfigError, match="is a folder, not a file"):
        load_toml(tmp_path, Toy)
    # a byte-order mark is not an error
    assert load_toml(_toml(tmp_path, '\ufefftitle = "t"\n'.encode()), Toy).title == "t"


def test_every_problem_is_one_line_naming_its_field(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        "folder = 3\n[limits]\nsize = -3\nmode = 'medium'\nsiez = 1\n"
        '[[item]]\nname = "ok"\n[[item]]\nname = ""\nsecret = "hunter2"\n'
        "[named.x]\nsize = 1.5\n[nmaed.y]\n",
    )
    assert _lines(path) == [
        f"{path}: title: missing; this field is required",
        f'{path}: folder: must be a quoted string, e.g. "...", got 3',
        f"{path}: [limits].size: must be >= 1, got -3",
        f"{path}: [limits].mode: must be 'fast' or 'slow', got 'medium'",
        f"{path}: [limits].siez: unknown key; did you mean 'size'?",
        f"{path}: [[item]] #2.name: must not be empty",
        f"{path}: [[item]] #2.secret: secrets never go in this file",
        f"{path}: [named.x].size: must be an integer, got 1.5",
        f"{path}: [nmaed]: unknown table; did you mean 'named'?",
    ]
    assert "hunter2" not in "\n".join(_lines(path))


def test_wrong_shapes_name_the_fix(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'title = "t"\nlimits = 3\nitem = "x"\nnamed = 1\nzzz = 1\n')
    assert _lines(path) == [
        f"{path}: [limits]: must be a table, got 3",
        f"{path}: item: must be an array of tables: write [[item]] tables",
        f"{path}: named: must be a table of tables: write [named.<name>] tables",
        f"{path}: zzz: unknown key; valid keys: title, folder, limits, item, named",
    ]


def test_a_section_of_a_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[tool.other]\nx = 1\n[toy]\ntitle = "t"\n[toy.limits]\nsize = 0\n')
    with pytest.raises(ConfigError) as info:
        load_toml(path, Toy, section="toy")
    assert str(info.value) == f"{path}: [toy.limits].size: must be >= 1, got 0"
    with pytest.raises(ConfigError, match=r"no \[missing\] table; add one"):
        load_toml(path, Toy, section="missing")
    assert read_toml(path)["tool"] == {"other": {"x": 1}}


def test_overrides_are_the_one_way_to_change_a_config(tmp_path: Path) -> None:
    toy = load_toml(_toml(tmp_path, 'title = "t"\n'), Toy)
    changed = toy.with_overrides({"limits.size": 5, "title": "u", "named.y.mode": "slow"})
    assert (changed.limits.size, changed.title, changed.named["y"].mode) == (5, "u", "slow")
    assert changed.folder == toy.folder == str(tmp_path / "data")  # stays resolved
    assert toy.limits.size == 1
    with pytest.raises(ConfigError) as info:
        toy.with_overrides({"limits.size": 0, "limits.mdoe": "x", "title": 3}, source="--flags")
    assert str(info.value).splitlines() == [
        '--flags: title: must be a quoted string, e.g. "...", got 3',
        "--flags: [limits].size: must be >= 1, got 0",
        "--flags: [limits].mdoe: unknown key; did you mean 'mode'?",
    ]
    with pytest.raises(ConfigError, match=r"cannot set 'title\.x': title is not a table"):
        toy.with_overrides({"title.x": 1})
    with pytest.raises(ConfigError, match="is not a dotted field path"):
        toy.with_overrides({"limits..size": 1})
    with pytest.raises(ValidationError):  # direct assignment is checked too
        toy.limits.size = 0


def test_checked_refuses_an_unvalidated_model() -> None:
    bad = Toy.model_construct(title="t", limits=Limits.model_construct(size=0))
    with pytest.raises(ConfigError, match=r"^Toy: \[limits\]\.size: must be >= 1, got 0$"):
        bad.checked()
    assert Toy(title="t").checked() == Toy(title="t")


# --- budgets.toml -------------------------------------------------------------------------


def test_budgets_file_reports_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "budgets.toml"
    path.write_text(
        "[budget.small]\nmax_concurrent = 0\nrequests_per_s = -1\n"
        "[budget.big]\nmax_concurrent = '8'\nrpm = 3\n[budgets.x]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_budgets(path)
    assert str(info.value).splitlines() == [
        f"{path}: [budget.small].max_concurrent: must be >= 1, got 0",
        f"{path}: [budget.small].requests_per_s: must be > 0, got -1",
        f"{path}: [budget.big].max_concurrent: must be an integer, got '8'",
        f"{path}: [budget.big].rpm: unknown key; valid keys: max_concurrent, requests_per_s",
        f"{path}: [budgets]: unknown table; did you mean 'budget'?",
    ]
    path.write_bytes(b"[budget.small]\n# \x80\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 0x80 at offset 17\)"):
        load_budgets(path)
    path.write_text("[budget.small]\nmax_concurrent = 4\nrequests_per_s = 2\n")
    assert load_budgets(path) == {"small": Budget("small", 4, 2.0)}
    assert budget_for("small", budgets_file=path, max_concurrent=9).max_concurrent == 9


def test_budget_arguments_obey_the_files_rules() -> None:
    with pytest.raises(VfopsError) as info:
        budget_for("small", budgets_file=None, max_concurrent=0, requests_per_s=float("inf"))
    assert str(info.value) == (
        "budget 'small': max_concurrent: must be >= 1, got 0; "
        "requests_per_s: must be a finite number, got inf"
    )
    with pytest.raises(VfopsError, match="max_concurrent: must be an integer, got true"):
        Budget("small", max_concurrent=True)


# --- endpoints.toml through the CLI --------------------------------------------------------


def _vfops(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_eval_with_a_bad_endpoints_file_is_one_line(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.toml"
    endpoints.write_text(
        '[[endpoint]]\nalias = "small"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key = "sk-live-do-not-echo"\n'
    )
    out = tmp_path / "out"
    args = ["eval", "arithmetic", "-m", "small", "-e", str(endpoints), "-o", str(out)]
    proc = _vfops(*args, "-a", '{"num_examples": 10}')
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "sk-live-do-not-echo" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {endpoints}: [[endpoint]] #1.api_key: a literal api_key is not allowed (keys "
        "never go in this file); remove it and set api_key_var to the NAME of an environment "
        "variable holding the key"
    ]
    assert not out.exists()
