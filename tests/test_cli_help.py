"""Every ``--help`` of the ``vfops`` CLI reads as written.

The help texts name extras and TOML tables in brackets (``[train]``, ``[nightly]``);
rendered as rich markup they vanished and left a doubled space ("needs the  extra").
Each command's help is rendered as a user sees it and compared with its source texts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer

from vfops.cli._app import build_app

BRACKETED = re.compile(r"\[[A-Za-z][\w.-]*\]")


def _commands() -> Iterator[tuple[str, Any, Any]]:
    # typer ships its own copy of click: its command and context classes, duck-typed
    root = typer.main.get_command(build_app())

    def walk(command: Any, path: str, parent: Any) -> Iterator[tuple[str, Any, Any]]:
        ctx = command.context_class(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
        yield path, command, ctx
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, f"{path} {name}", ctx)

    yield from walk(root, "vfops", None)


COMMANDS = list(_commands())


def _source_texts(command: Any) -> list[str]:
    texts = [command.help or "", command.short_help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return texts


@pytest.mark.parametrize("path,command,ctx", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_help_keeps_every_word(path: str, command: Any, ctx: Any) -> None:
    rendered = " ".join(command.get_help(ctx).split())  # wrapping may split a line anywhere
    for text in _source_texts(command):
        for word in BRACKETED.findall(text):
            assert word in rendered, f"{path} --help lost {word!r}"
    assert "``" not in rendered, f"{path} --help shows reStructuredText backticks"
    assert "--no-no-" not in rendered, f"{path} --help shows a doubled negative flag"


def test_the_walk_reaches_every_command() -> None:
    paths = {path for path, _, _ in COMMANDS}
    assert {"vfops train", "vfops env install", "vfops deploy", "vfops runs show"} <= paths
    # the texts that lost their brackets before are among those checked
    train = next(c for p, c, _ in COMMANDS if p == "vfops train")
    assert "[train]" in (train.help or "")


def test_deploy_help_names_every_deployment() -> None:
    from vfops.orchestration import deployment_specs

    deploy = next(c for p, c, _ in COMMANDS if p == "vfops deploy")
    text = " ".join((deploy.help or "").split())
    names = [spec.name for spec in deployment_specs(nightly_parameters={})]
    assert "nightly-eval" in names and len(names) >= 8
    for name in names:
        assert name in text, f"vfops deploy --help does not name {name}"


def test_the_readme_flag_table_gives_the_cli_defaults() -> None:
    # The README's `vfops eval` table states each flag's default; the CLI's are the
    # truth (defined once, in the command), and the table must not drift from them.
    from pathlib import Path

    from vfops.clients import DEFAULT_API_KEY_VAR

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("| flag | meaning | default |") :].split("\n\n", 1)[0]
    eval_command = next(command for path, command, _ in COMMANDS if path == "vfops eval")
    defaults = {opt: param.default for param in eval_command.params for opt in param.opts}
    defaults["-k"] = DEFAULT_API_KEY_VAR  # resolved when unset (vfops.clients)
    words = {"none": None, "the endpoint's": None, "checked": True}
    checked = 0
    for row in table.splitlines()[2:]:
        flags, _, default = (cell.strip() for cell in row.strip("|").rsplit("|", 2))
        first = re.match(r"`(--?[\w-]+)", flags)
        assert first is not None, row
        flag = "-k" if "-k/" in flags else first.group(1).replace("--no-", "--")
        stated = default.strip("`").split(" for ")[0].strip("`")
        expected = defaults[flag]
        if stated in words:
            assert expected == words[stated], (row, expected)
        elif isinstance(expected, int | float) and not isinstance(expected, bool):
            assert float(stated) == expected, (row, expected)
        else:
            assert stated == str(expected), (row, expected)
        checked += 1
    assert checked >= 15
