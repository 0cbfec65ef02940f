"""Help that reads as written: usage lines and command lists a user can read aloud.

Typer renders a required argument as ``{env}`` in a usage line and an option's value
as ``<str>``, and click cuts each command's description in a group's list at about 45
columns with "..." (or at the first word ending in a period, such as "e.g."). The
whole command tree is rewritten once, when the root group is built
(:class:`ReadableGroup`): arguments read ``ENV``, values ``TEXT``/``INTEGER``/
``FLOAT``/``PATH`` (click's own words), and a command's line in a list is the first
paragraph of its help, whole (wrapped, never cut).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperGroup

__all__ = ["ReadableGroup", "readable"]

_VALUE_NAMES = {
    "str": "TEXT",
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "FLOAT",
    "float range": "FLOAT",
    "path": "PATH",
    "boolean": "BOOLEAN",
}
"""An option value's metavar by its type's name (typer's vendored click names them)."""


class _Argument(TyperArgument):
    """An argument shown by its name in capitals: ``ENV``, ``[RUNS]...``."""

    @property
    def human_readable_name(self) -> str:  # what errors call it: "Missing argument 'ENV'."
        return self.metavar or (self.name or "").upper()

    def make_metavar(self, ctx: Any, *, usage: bool = False) -> str:
        name = self.human_readable_name
        if usage and not self.required:
            name = f"[{name}]"
        return f"{name}..." if self.nargs != 1 else name


def readable(command: Any) -> None:
    """Rewrite ``command`` and every command under it (see the module docstring)."""
    for param in command.params:
        if type(param) is TyperArgument:
            # only the rendering changes: parsing and values are TyperArgument's
            param.__class__ = _Argument
        elif param.param_type_name == "option" and param.metavar is None:
            type_name = getattr(param.type, "name", "")
            if type_name in _VALUE_NAMES:
                param.metavar = _VALUE_NAMES[type_name]
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = first_paragraph(sub.help)
        readable(sub)


def first_paragraph(text: str) -> str:
    """The first paragraph of a help text, on one line."""
    return " ".join(text.strip().split("\n\n", 1)[0].split())


class ReadableGroup(TyperGroup):
    """The root group: the tree below it is built first (typer builds the sub-commands
    before the group), then made readable here, once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        readable(self)
