"""One way to read every vfops config file: a pydantic base model and a TOML loader.

Every config (training, endpoints.toml, budgets.toml, sweep and nightly specs) is a
:class:`ConfigModel`: unknown keys are refused, types are strict (TOML is typed, so
``"8"`` is not an integer), defaults live in the fields and every field's
``description`` is its help text. :func:`load_toml` reads a file and reports every
problem of the file at once as one :class:`ConfigError`, one line per problem, each
prefixed by the file and naming the field (``c.toml: [run].steps: must be >= 0, got
-3``). :meth:`ConfigModel.with_overrides` is the one way CLI flags and flow
parameters change a loaded config; it validates the same way.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self, TypeVar, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo

from vfops._env_vars import check_env_var_name
from vfops._errors import VfopsError

__all__ = [
    "CONFIG_DIR",
    "ConfigError",
    "ConfigModel",
    "EnvVarName",
    "RelativePath",
    "check_env_var_name",
    "describe_errors",
    "load_toml",
    "read_toml",
]

CONFIG_DIR = "config_dir"
"""Validation-context key: the folder of the file being loaded (see :data:`RelativePath`)."""

_SHOWN_CHARS = 60


class ConfigError(VfopsError):
    """A config file or override is unreadable or invalid; one line per problem."""


def _resolve_relative(value: str, info: ValidationInfo) -> str:
    base = (info.context or {}).get(CONFIG_DIR)
    if not value or base is None:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (Path(base) / path).resolve())


RelativePath = Annotated[str, AfterValidator(_resolve_relative)]
"""A path string that, in a loaded file, resolves against the file's folder."""

EnvVarName = Annotated[str, AfterValidator(check_env_var_name)]
"""The name of an environment variable that holds a secret; the secret never goes here."""


class ConfigModel(BaseModel):
    """Base of every vfops config: strict types, no unknown keys, help per field."""

    # validate_default + revalidate_instances: defaults (default sections too) obey the
    # rules and default paths resolve against the file's folder like the file's own
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        validate_assignment=True,
        validate_default=True,
        revalidate_instances="always",
    )

    unknown_key_hints: ClassVar[dict[str, str]] = {}
    """Unknown key -> what to do instead (replaces the close-match hint)."""

    @classmethod
    def from_data(
        cls,
        data: Mapping[str, Any],
        *,
        source: str,
        section: str | None = None,
        context: Mapping[str, Any] | None = None,
        error: type[ConfigError] = ConfigError,
    ) -> Self:
        """Validate TOML-shaped ``data``; every problem becomes a line of one ``error``.

        ``source`` prefixes each line (the file); ``section`` is the table ``data``
        came from, so paths read ``[section].field``.
        """
        try:
            model = cls.model_validate(data, context=dict(context or {}))
        except ValidationError as exc:
            lines = describe_errors(exc, cls, section=section)
            raise error("\n".join(f"{source}: {line}" for line in lines)) from None
        return model

    def with_overrides(self, overrides: Mapping[str, Any], *, source: str = "overrides") -> Self:
        """A copy with dotted keys set (``{"run.steps": 5}``), validated like a file;
        ``source`` prefixes each error line."""
        data = self.model_dump(warnings=False)
        for key, value in overrides.items():
            _set_dotted(data, key, value, source)
        return type(self).from_data(data, source=source)

    def checked(self) -> Self:
        """This config validated again as a whole (after edits in Python, or built with
        ``model_construct``); errors are prefixed with the class name."""
        data = self.model_dump(warnings=False)
        return type(self).from_data(data, source=type(self).__name__)

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """``"section.field"`` -> the field's description, for every leaf field."""
        out: dict[str, str] = {}
        for name, info in cls.model_fields.items():
            inner = _model_of(info.annotation)
            if inner is not None:
                out.update({f"{name}.{k}": v for k, v in inner.field_help().items()})
            else:
                out[name] = info.description or ""
        return out


_M = TypeVar("_M", bound=ConfigModel)


def read_toml(path: str | Path, *, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """The TOML table of ``path``; unreadable, non-UTF-8 or malformed files raise one line."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise error(f"{file}: file not found; create it or pass the right path") from None
    except IsADirectoryError:
        raise error(f"{file}: is a folder, not a file; pass a TOML file") from None
    except OSError as exc:
        raise error(f"{file}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise error(
            f"{file}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{file}: invalid TOML {_toml_position(exc)}; fix the syntax") from None


def _toml_position(exc: tomllib.TOMLDecodeError) -> str:
    # Python < 3.14 has no lineno/colno attributes: the position ends the message.
    message = str(exc)
    found = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, flags=re.S)
    if found:
        return f"at line {found[2]}, column {found[3]}: {found[1]}"
    if message.endswith(" (at end of document)"):
        return f"at the end of the file: {message.removesuffix(' (at end of document)')}"
    return f"({message})"


def load_toml(
    path: str | Path,
    model: type[_M],
    *,
    section: str | None = None,
    error: type[ConfigError] = ConfigError,
    config_dir: Path | None = None,
) -> _M:
    """Read ``path`` (or its ``[section]`` table) into ``model``, every problem reported.

    Fields typed :data:`RelativePath` resolve against the file's folder, or against
    ``config_dir`` when given (a shipped example: vfops/_examples.py).
    """
    file = Path(path)
    data: Any = read_toml(file, error=error)
    if section is not None:
        data = data.get(section)
        if not isinstance(data, dict):
            raise error(f"{file}: no [{section}] table; add one")
    return model.from_data(
        data,
        source=str(file),
        section=section,
        # the folder the file is named in, links not followed: a linked config
        # (configs/train/cpu_lucky_digit.toml) resolves where the user sees it
        context={CONFIG_DIR: config_dir or file.absolute().parent},
        error=error,
    )


# --------------------------------------------------------------------------- overrides


def _set_dotted(data: dict[str, Any], key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"{source}: override key {key!r} is not a dotted field path")
    table = data
    for depth, part in enumerate(parts[:-1]):
        inner = table.setdefault(part, {})
        if not isinstance(inner, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(f"{source}: cannot set {key!r}: {where} is not a table")
        table = inner
    table[parts[-1]] = value


# --------------------------------------------------------------------------- error lines


def _unwrap_optional(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap_optional(args[0])
    if origin is Annotated:
        return _unwrap_optional(get_args(annotation)[0])
    return annotation


def _model_of(annotation: Any) -> type[ConfigModel] | None:
    annotation = _unwrap_optional(annotation)
    if isinstance(annotation, type) and issubclass(annotation, ConfigModel):
        return annotation
    return None


def _container_model(annotation: Any) -> tuple[str, type[ConfigModel]] | None:
    """``("list", M)`` for ``list[M]``, ``("dict", M)`` for ``dict[str, M]``."""
    annotation = _unwrap_optional(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list and len(args) == 1:
        item = _model_of(args[0])
        if item is not None:
            return "list", item
    if origin is dict and len(args) == 2:
        value = _model_of(args[1])
        if value is not None:
            return "dict", value
    return None


class _Location:
    """Where an error is: ``[table].key`` (``[[array]] #N.key`` in arrays of tables)."""

    def __init__(self, section: str | None) -> None:
        self.tables = [section] if section else []
        self.array_index: int | None = None
        self.keys: list[str] = []
        self.holder: type[ConfigModel] | None = None
        """The model whose field the last key is (for unknown-key hints)."""
        self.container: str | None = None
        """"list"/"dict" when the error is about a list/dict of tables itself."""

    def render(self, *, unknown_table: bool) -> str:
        if self.container is not None:
            self.keys.append("." + self.tables.pop())
        if unknown_table and len(self.keys) == 1 and self.array_index is None:
            self.tables.append(self.keys.pop()[1:])
        name = ".".join(self.tables)
        if self.array_index is not None:
            head = f"[[{name}]] #{self.array_index + 1}"
        else:
            head = f"[{name}]" if name else ""
        key = "".join(self.keys)
        return head + key if head else key.lstrip(".")


def _locate(model: type[ConfigModel], loc: tuple[str | int, ...], section: str | None) -> _Location:
    """Walk ``loc`` along the model's field types (tables vs keys vs arrays of tables)."""
    where = _Location(section)
    current: type[ConfigModel] | None = model
    where.holder = model
    for part in loc:
        if where.container is not None:
            kind, where.container = where.container, None
            if kind == "list" and isinstance(part, int):
                where.array_index = part
                continue
            if kind == "dict" and isinstance(part, str):
                where.tables.append(part)
                continue
        if current is None or not isinstance(part, str):
            where.holder = None
            where.keys.append(f"[{part}]" if isinstance(part, int) else f".{part}")
            current = None
            continue
        where.holder = current
        info = current.model_fields.get(part)
        annotation = info.annotation if info is not None else None
        inner_model, container = _model_of(annotation), _container_model(annotation)
        if inner_model is not None:
            where.tables.append(part)
            current = inner_model
        elif container is not None:
            where.tables.append(part)
            where.container, current = container
        else:
            where.keys.append(f".{part}")
            current = None
    return where


def describe_errors(
    exc: ValidationError, model: type[ConfigModel], *, section: str | None = None
) -> list[str]:
    """One ``<field path>: <problem>`` line per pydantic error."""
    lines: list[str] = []
    for err in exc.errors():
        where = _locate(model, tuple(err["loc"]), section)
        unknown_table = err["type"] == "extra_forbidden" and isinstance(err.get("input"), dict)
        if where.container == "list" and err["type"] == "list_type":
            problem = f"must be an array of tables: write [[{where.tables[-1]}]] tables"
        elif where.container == "dict" and err["type"] in ("dict_type", "model_type"):
            problem = f"must be a table of tables: write [{where.tables[-1]}.<name>] tables"
        elif err["type"] == "missing" and where.tables and not where.keys:
            problem = f"missing; add the [{'.'.join(where.tables)}] table"
        else:
            problem = _problem(err, where.holder)
        if unknown_table:
            problem = problem.replace("unknown key", "unknown table", 1)
        path = where.render(unknown_table=unknown_table)
        lines.append(f"{path}: {problem}" if path else problem)
    return lines


def _show(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, dict):
        text = "a table"
    else:
        text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _number(bound: Any) -> str:
    if isinstance(bound, float) and bound.is_integer():
        return str(int(bound))
    return str(bound)


_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}

_TYPES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": 'a quoted string, e.g. "..."',
    "list_type": "a list, e.g. [...]",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "finite_number": "a finite number",
}


def _problem(err: Any, parent: type[ConfigModel] | None) -> str:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        return _unknown_key(str(err["loc"][-1]), parent)
    if kind == "missing":
        return "missing; this field is required"
    if kind in _BOUNDS:
        name, op = _BOUNDS[kind]
        return f"must be {op} {_number(ctx[name])}, got {_show(value)}"
    if kind in _TYPES:
        return f"must be {_TYPES[kind]}, got {_show(value)}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}, got {_show(value)}"
    if kind == "string_too_short":
        return "must not be empty" if ctx.get("min_length") == 1 else str(err["msg"])
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {len(value or [])}"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    return f"{err['msg']}, got {_show(value)}"


def _unknown_key(key: str, parent: type[ConfigModel] | None) -> str:
    if parent is None:
        return "unknown key"
    hint = parent.unknown_key_hints.get(key)
    if hint:
        return hint
    valid = list(parent.model_fields)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    return f"unknown key; valid keys: {', '.join(valid)}"
