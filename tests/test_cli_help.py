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


def _help(path: str, width: int = 80) -> str:
    """``PATH --help`` as a user sees it in an 80-column terminal."""
    command = next(c for p, c, _ in COMMANDS if p == path)
    parent = None
    for name in path.split()[:-1]:  # the contexts above it, for its usage line
        above = next(
            c for p, c, _ in COMMANDS if p.endswith(name) and p.count(" ") < path.count(" ")
        )
        parent = above.context_class(above, info_name=name, parent=parent, terminal_width=width)
    ctx = command.context_class(
        command, info_name=path.rsplit(" ", 1)[-1], parent=parent, terminal_width=width
    )
    return str(command.get_help(ctx))


def test_version(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.inprocess_cli import run_vfops
    from vfops import __version__

    code, stderr = run_vfops(["--version"], monkeypatch)
    assert (code, stderr) == (0, "")
    assert capsys.readouterr().out == f"vfops {__version__}\n"
    assert "--version" in _help("vfops")


TYPER_METAVAR = re.compile(r"\{[a-z_]+\}|<(?:str|int|float|path|int range|float range)>")


@pytest.mark.parametrize("path,command,ctx", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_usage_and_values_read_as_words(path: str, command: Any, ctx: Any) -> None:
    # typer wrote a required argument as {env} in the usage line and a value as <str>
    rendered = _help(path)
    assert TYPER_METAVAR.search(rendered) is None, f"{path} --help: {rendered}"


def test_usage_lines_name_arguments_in_capitals() -> None:
    assert "Usage: vfops eval [OPTIONS] ENV\n" in _help("vfops eval")
    assert "Usage: vfops promote [OPTIONS] NAME VERSION\n" in _help("vfops promote")
    assert "Usage: vfops runs export [OPTIONS] RUN_ID" in _help("vfops runs export")
    rendered = _help("vfops eval")
    for option in ("-n, --num-examples INTEGER", "-T, --temperature FLOAT", "-m, --model TEXT"):
        assert option in rendered, option


GROUPS = [path for path, command, _ in COMMANDS if hasattr(command, "list_commands")]


@pytest.mark.parametrize("path", GROUPS)
def test_a_group_lists_each_command_with_its_whole_first_paragraph(path: str) -> None:
    # click cut each line at ~45 columns with "..." (or after "e.g.")
    from vfops.cli._help import first_paragraph

    rendered = _help(path)
    listing = rendered.split("Commands:\n", 1)[1]
    assert "..." not in listing, listing
    flat = " ".join(listing.split())
    group = next(c for p, c, _ in COMMANDS if p == path)
    for name in group.list_commands(None):
        sub = group.get_command(None, name)
        assert f"{name} {sub.short_help}" in flat, (name, listing)
        if name != "deploy":  # its first paragraph names every deployment: it has its own
            assert sub.short_help == first_paragraph(sub.help), name


def test_env_and_model_say_what_each_of_their_commands_does() -> None:
    # `vfops env`'s line said "Create, install and list": three of its six commands
    root_listing = " ".join(_help("vfops").split("Commands:", 1)[1].split())
    for group, verbs in {
        "env": ("create", "install", "publish", "list", "show", "garbage-collect"),
        "model": ("build", "serve", "register"),
    }.items():
        line = root_listing.split(f" {group} ", 1)[1].split(".", 1)[0]
        for verb in verbs:
            assert verb in line.lower(), (group, verb, line)


def test_promote_history_has_a_help_of_its_own() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(build_app(), ["promote", "history", "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: vfops promote history [OPTIONS] NAME\n"), result.output
    assert "VERSION" not in result.output and "--env" not in result.output
    assert "NAME  Registered model name." in result.output
    missing = CliRunner().invoke(build_app(), ["promote", "history"])
    assert missing.exit_code == 2 and "Missing argument 'NAME'" in missing.output
    # the gate's own help no longer explains the history form's arguments
    assert "'history'" not in _help("vfops promote")


def test_promote_history_lists_the_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(build_app(), ["promote", "history", "no-such-model"])
    assert result.exit_code == 0, result.output
    assert result.output == "no promotion decisions recorded for no-such-model\n"
