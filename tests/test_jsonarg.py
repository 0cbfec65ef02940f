"""``-a``/``-S`` values: a JSON object inline, or ``@FILE`` (JSON, or TOML by suffix); and
the one line an environment's load error is told in."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfops._errors import VfopsError
from vfops._jsonarg import parse_json_object


def test_inline_and_file_values_read_alike(tmp_path: Path) -> None:
    judges = {"task": {"judges": [{"id": "reference", "model": "m", "weight": 0.5}]}}
    (tmp_path / "args.json").write_text('{"task": {"judges": [{"id": "reference", '
                                        '"model": "m", "weight": 0.5}]}}')  # fmt: skip
    (tmp_path / "args.toml").write_text(
        '[[task.judges]]\nid = "reference"\nmodel = "m"\nweight = 0.5\n'
    )
    assert parse_json_object('{"task": {"judges": [{"id": "reference", "model": "m", '
                             '"weight": 0.5}]}}', "-a") == judges  # fmt: skip
    assert parse_json_object(f"@{tmp_path / 'args.json'}", "-a") == judges
    assert parse_json_object(f"@{tmp_path / 'args.toml'}", "-a") == judges


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.json", None, "cannot read it"),
        ("bad.toml", "task = [", "is not valid TOML"),
        ("bad.json", "{", "is not valid JSON"),
        ("list.json", "[1]", "must hold an object, got list"),
    ],
)
def test_a_bad_file_is_named_in_one_line(
    tmp_path: Path, name: str, content: str | None, expected: str
) -> None:
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(VfopsError) as caught:
        parse_json_object(f"@{tmp_path / name}", "-a")
    message = str(caught.value)
    assert expected in message and name in message and "\n" not in message


def test_a_load_errors_one_line_is_its_first_line_with_words() -> None:
    # NLTK opens a missing-resource error with a banner of asterisks, and colours it
    from vfops.envs._load_errors import first_line

    banner = "\n" + "*" * 70 + "\n  \x1b[93mResource words not found.\x1b[0m\n  Please use nltk"
    assert first_line(LookupError(banner)) == "LookupError: Resource words not found."
    assert first_line(ValueError("")) == "ValueError"
