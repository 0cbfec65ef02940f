"""The rollout record: one trace of one model attempt at one example.

It is the unit every later layer consumes (the eval writer, the registry, the
trainer), so it serialises without loss to JSON and to a ``datasets`` row.
Free-form fields (messages, info, metrics, sampling args) become JSON strings in
a ``datasets`` row, because Arrow's struct inference would otherwise unify keys
across rows and invent ``None`` fields that were never there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from vfops._types import Info, Messages, SamplingArgs

StopReason = Literal[
    "completed",  # the model or the environment ended the rollout (is_completed)
    "max_turns",  # the turn budget ran out
    "length",  # the model hit max_tokens: the completion is truncated
    "prompt_too_long",  # the server refused the context as too long
    "timeout",  # the per-rollout timeout expired
    "error",  # generation or the environment raised; see ``error``
]

ErrorStage = Literal["generation", "environment", "scoring"]


@dataclass(slots=True)
class RolloutError:
    """What went wrong in a rollout: exception type, message and the stage."""

    type: str
    message: str
    stage: ErrorStage

    @classmethod
    def from_exception(cls, exc: BaseException, stage: ErrorStage) -> RolloutError:
        return cls(type=type(exc).__name__, message=str(exc)[:2000], stage=stage)

    def to_dict(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message, "stage": self.stage}


@dataclass(slots=True)
class Timing:
    """Wall-clock milliseconds spent generating (model + environment) and scoring."""

    generation_ms: float = 0.0
    scoring_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.generation_ms + self.scoring_ms


@dataclass(slots=True)
class TokenUsage:
    """Token counts summed over every model call of the rollout, and its cost.

    ``cost_usd`` sums the calls of priced endpoints (the policy's and the judges'
    that scored this rollout); ``None`` when none was priced, never 0 for "unknown".
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the endpoint served from its cache (part of ``prompt_tokens``)."""
    cost_usd: float | None = None

    def add(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cached_tokens += cached_tokens

    def add_cost(self, usd: float | None) -> None:
        """Add one call's cost (``None``: an unpriced call, which changes nothing)."""
        if usd is not None:
            self.cost_usd = usd if self.cost_usd is None else self.cost_usd + usd


EPISODE_TRACE_SLOTS = 1000
"""Rollout indices one planned episode reserves for its traces (see
:attr:`RolloutRecord.episode`): trace ``t`` of episode ``e`` is ``e * 1000 + t``."""


def episode_of(rollout_index: int, *, multi_trace: bool) -> int:
    """The planned episode a stored rollout index belongs to."""
    return rollout_index // EPISODE_TRACE_SLOTS if multi_trace else rollout_index


def new_trace_id() -> str:
    # 128 random bits as hex, like uuid4().hex without building a UUID object.
    return os.urandom(16).hex()


@dataclass(slots=True)
class RolloutRecord:
    """One rollout, generated and scored. ``reward`` is ``None`` when scoring failed."""

    example_id: int
    rollout_index: int
    prompt: Messages
    completion: Messages
    answer: str = ""
    info: Info = field(default_factory=dict)
    task: str = "default"
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stop_reason: StopReason = "completed"
    error: RolloutError | None = None
    timing: Timing = field(default_factory=Timing)
    usage: TokenUsage = field(default_factory=TokenUsage)
    turns: int = 0
    episode: int | None = None
    """The planned episode (``rollout_index`` of the runner) this trace belongs to, when
    its episode produced several traces (a multi-agent ``Env``, a role run twice); then
    ``rollout_index`` is ``episode * EPISODE_TRACE_SLOTS + position``. ``None``: the
    rollout is its episode's only trace (``rollout_index`` is the episode)."""
    agent: str = ""
    """The agent (role) whose trace this is, in an episode of several agents' traces."""
    trace_id: str = field(default_factory=new_trace_id)
    model: str = ""
    sampling_args: SamplingArgs = field(default_factory=dict)

    @property
    def is_truncated(self) -> bool:
        return self.stop_reason == "length"

    @property
    def episode_key(self) -> tuple[int, int]:
        """Identity of the rollout's episode inside a run: (example_id, episode)."""
        episode = self.rollout_index if self.episode is None else self.episode
        return (self.example_id, episode)

    @property
    def key(self) -> tuple[int, int]:
        """Identity of the rollout inside a run: (example_id, rollout_index)."""
        return (self.example_id, self.rollout_index)

    # --- JSON -----------------------------------------------------------------------
    # The converters are generated from ROLLOUT_COLUMNS (below). to_dict, to_json and
    # to_row are replaced by the generated functions themselves: they are hot paths,
    # and a wrapper's extra call cost 5-10 % there.
    def to_dict(self) -> dict[str, Any]:
        """The JSON record: every column, each part's columns nested under the part."""
        return _to_dict(self)

    def to_json(self) -> bytes:
        """One JSON line (no trailing newline). Non-JSON values in info become strings."""
        return _to_json(self)

    def escaped(self) -> RolloutRecord:
        """A copy whose text encodes as UTF-8: lone surrogates written as their escape
        (for a store that refused the record's text; see :func:`escape_unencodable`)."""
        return _from_dict(escape_unencodable(_to_dict(self)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutRecord:
        """Read a JSON record; a field missing from an older file takes its default."""
        return _from_dict(data)

    @classmethod
    def from_json(cls, line: bytes | str) -> RolloutRecord:
        return _from_dict(orjson.loads(line))

    # --- flat rows (datasets, Arrow) ------------------------------------------------
    def to_row(self) -> dict[str, Any]:
        """A flat row whose columns match :func:`rollout_features`."""
        return _to_row(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RolloutRecord:
        return _from_row(row)


def _dumps(value: Any) -> str:
    try:  # inline, not dumps_escaped: a call per JSON column of every row adds up
        return orjson.dumps(value, default=str).decode()
    except orjson.JSONEncodeError:
        return dumps_escaped(value).decode()


# --- text that UTF-8 cannot encode --------------------------------------------------
#
# A Python str may hold a lone surrogate (a dataset row's "\ud800", JSON decoded by
# the standard library, a file name read with surrogateescape), which no UTF-8
# encoder takes: orjson, SQLite, psycopg and Arrow all refuse it. A record must not
# fail a run for it, nor lose it silently, so such text is recorded escaped: the
# surrogate becomes the six characters ``\ud800``. orjson goes first and the escaping
# runs only on its error, so valid text (the common case) costs nothing more.


def escape_unencodable(value: Any) -> Any:
    """``value`` with every lone surrogate in its text (dict keys too) written as its
    literal escape (``\\ud800``); lists, tuples and dicts are copied, the rest kept."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {escape_unencodable(k): escape_unencodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape_unencodable(item) for item in value]
    return value


def _escaped_str(value: Any) -> str:
    # orjson's ``default`` for non-JSON values: their str, escaped like any text
    text: str = escape_unencodable(str(value))
    return text


def dumps_escaped(value: Any, option: int | None = None) -> bytes:
    """``orjson.dumps(value, default=str)``, with unencodable text escaped (see above)
    instead of raising; non-JSON values become their str."""
    try:
        return orjson.dumps(value, default=str, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(escape_unencodable(value), default=_escaped_str, option=option)


# --- the schema, declared once -------------------------------------------------------

ColumnKind = Literal["int", "float", "str", "json"]
PartName = Literal["error", "timing", "usage"]


@dataclass(frozen=True, slots=True)
class RolloutColumn:
    """One flat column of the rollout schema (see :data:`ROLLOUT_COLUMNS`)."""

    name: str
    # "json": a free-form value; a JSON string in flat rows (see the module docstring)
    kind: ColumnKind
    nullable: bool = False
    # A field of a sub-record, ``record.<part>.<key>``; the JSON record nests a part's
    # columns in one object under the part's name. A part whose columns are all
    # nullable is optional: ``None`` on the record, every column null in a flat row.
    part: PartName | None = None
    key: str = ""  # the sub-record's field; "" means the column's name
    # from_dict refuses a record without it; any other missing field takes its default
    required: bool = False
    # storage hints for the registry: VARCHAR length (None: unbounded text), 64-bit int
    max_length: int | None = None
    big: bool = False
    # the same for every rollout of a run: the registry stores it once, on the run
    per_run: bool = False
    # what rows stored before the column existed hold (the registry's server default)
    stored_default: str | None = None

    @property
    def attr(self) -> str:
        """The attribute holding the value, on the record or on its part."""
        return self.key or self.name


ROLLOUT_COLUMNS: tuple[RolloutColumn, ...] = (
    RolloutColumn("trace_id", "str", required=True, max_length=32),
    RolloutColumn("example_id", "int", required=True, big=True),
    RolloutColumn("rollout_index", "int", required=True),
    RolloutColumn("task", "str", max_length=200),
    RolloutColumn("prompt", "json", required=True),
    RolloutColumn("completion", "json", required=True),
    RolloutColumn("answer", "str"),
    RolloutColumn("info", "json"),
    RolloutColumn("reward", "float", nullable=True),
    RolloutColumn("metrics", "json"),
    RolloutColumn("stop_reason", "str", max_length=32),
    RolloutColumn("error_type", "str", nullable=True, part="error", key="type", max_length=200),
    RolloutColumn("error_message", "str", nullable=True, part="error", key="message"),
    RolloutColumn("error_stage", "str", nullable=True, part="error", key="stage", max_length=20),
    RolloutColumn("generation_ms", "float", part="timing"),
    RolloutColumn("scoring_ms", "float", part="timing"),
    RolloutColumn("prompt_tokens", "int", part="usage"),
    RolloutColumn("completion_tokens", "int", part="usage"),
    RolloutColumn("cached_tokens", "int", part="usage"),
    RolloutColumn("cost_usd", "float", nullable=True, part="usage"),
    RolloutColumn("turns", "int"),
    RolloutColumn("episode", "int", nullable=True),
    RolloutColumn("agent", "str", max_length=200, stored_default=""),
    RolloutColumn("model", "str", per_run=True),
    RolloutColumn("sampling_args", "json", per_run=True),
)
"""The rollout schema in column order. Derived from it: the JSON record
(``to_dict``/``from_dict``), the flat row (``to_row``/``from_row``), the ``datasets``
features, the Arrow schema, and the registry's ``rollouts`` table and bulk insert."""

PART_TYPES: dict[str, type[Any]] = {"error": RolloutError, "timing": Timing, "usage": TokenUsage}
"""The sub-record class of each part (``RolloutRecord.<part>``)."""

# Arrow type names (also the ``datasets.Value`` dtypes); JSON travels as a string.
_ARROW_TYPE_NAMES: dict[str, str] = {
    "int": "int64",
    "float": "float64",
    "str": "string",
    "json": "string",
}


def rollout_features() -> Any:
    """The ``datasets.Features`` of a rollout row (imported lazily: datasets is heavy)."""
    from datasets import Features, Value

    return Features({c.name: Value(_ARROW_TYPE_NAMES[c.kind]) for c in ROLLOUT_COLUMNS})


def rollout_arrow_schema() -> Any:
    """The ``pyarrow.Schema`` of a rollout row (pyarrow is imported on first use)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(c.name, pa.type_for_alias(_ARROW_TYPE_NAMES[c.kind]), nullable=c.nullable)
            for c in ROLLOUT_COLUMNS
        ]
    )


# --- converters, generated from the schema --------------------------------------------
#
# Each converter is compiled once, at import, from ROLLOUT_COLUMNS into the
# straight-line code one would write by hand (as ``dataclasses`` does for
# ``__init__``): to_json and the registry's row building run thousands of times a
# second, and interpreting the column specs per record would be several times slower.
# Parts are read once per record into ``p_<part>`` locals.


def part_columns(part: str) -> list[RolloutColumn]:
    """The columns of one part, in schema order."""
    return [c for c in ROLLOUT_COLUMNS if c.part == part]


def optional_part(part: str) -> bool:
    """Whether the part may be ``None`` on a record (all its columns are nullable)."""
    return all(c.nullable for c in part_columns(part))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


class _Generated:
    """The namespace of one generated function: the objects its source refers to."""

    def __init__(self, dumps: Callable[[Any], str] = _dumps) -> None:
        self.namespace: dict[str, Any] = {
            "Record": RolloutRecord,
            "dumps": dumps,
            "loads": orjson.loads,
            "opt_int": _opt_int,
        }
        self.namespace.update({f"Part_{name}": cls for name, cls in PART_TYPES.items()})

    def constant(self, name: str, value: Any) -> str:
        self.namespace[name] = value
        return name

    def compile(self, name: str, lines: Sequence[str]) -> Any:
        code = compile("\n".join(lines) + "\n", f"<rollout schema: {name}>", "exec")
        exec(code, self.namespace)  # the source is built from ROLLOUT_COLUMNS only
        return self.namespace[name]


def _read(column: RolloutColumn, seen: set[str], *, dumps: bool) -> str:
    """The expression of ``column``'s value on record ``r`` (JSON text when ``dumps``).

    A part is bound to ``p_<part>`` at its first column (a walrus, so the
    expression also works inside a comprehension).
    """
    if column.part is None:
        value = f"r.{column.name}"
    else:
        local = f"p_{column.part}"
        ref = local if column.part in seen else f"({local} := r.{column.part})"
        seen.add(column.part)
        if optional_part(column.part):
            value = f"None if {ref} is None else {local}.{column.attr}"
        else:
            value = f"{ref}.{column.attr}"
    return f"dumps({value})" if dumps and column.kind == "json" else value


def _nested_part(part: str) -> str:
    local, members = f"p_{part}", part_columns(part)
    if optional_part(part):
        fields = ", ".join(f"{c.attr!r}: {local}.{c.attr}" for c in members)
        return f"None if ({local} := r.{part}) is None else {{{fields}}}"
    refs = [f"({local} := r.{part})"] + [local] * (len(members) - 1)
    fields = ", ".join(f"{c.attr!r}: {ref}.{c.attr}" for c, ref in zip(members, refs, strict=True))
    return f"{{{fields}}}"


def _json_record_items() -> list[str]:
    """The items of the JSON record's dict display, read from record ``r``."""
    items: list[str] = []
    for column in ROLLOUT_COLUMNS:
        if column.part is None:
            items.append(f"{column.name!r}: r.{column.name}")
        elif column is part_columns(column.part)[0]:  # one nested object per part
            items.append(f"{column.part!r}: {_nested_part(column.part)}")
    return items


def _build_to_dict() -> Callable[[RolloutRecord], dict[str, Any]]:
    items = _json_record_items()
    lines = ["def to_dict(r):", "    return {", *(f"        {item}," for item in items), "    }"]
    built: Callable[[RolloutRecord], dict[str, Any]] = _Generated().compile("to_dict", lines)
    return built


def _build_to_json() -> Callable[[RolloutRecord], bytes]:
    # the dict display inlined into the orjson call: one Python call per record
    # (a try costs nothing until it catches): text orjson refuses is written escaped
    generated = _Generated()
    generated.constant("json_dumps", orjson.dumps)
    generated.constant("dumps_escaped", dumps_escaped)
    generated.constant("to_dict", _build_to_dict())
    generated.constant("EncodeError", orjson.JSONEncodeError)
    generated.constant("OPTIONS", orjson.OPT_SERIALIZE_NUMPY)
    items = _json_record_items()
    lines = [
        "def to_json(r):",
        "    try:",
        "        return json_dumps({",
        *(f"            {item}," for item in items),
        "        }, default=str, option=OPTIONS)",
        "    except EncodeError:",
        "        return dumps_escaped(to_dict(r), OPTIONS)",
    ]
    built: Callable[[RolloutRecord], bytes] = generated.compile("to_json", lines)
    return built


def _build_to_row() -> Callable[[RolloutRecord], dict[str, Any]]:
    seen: set[str] = set()
    items = [f"{c.name!r}: {_read(c, seen, dumps=True)}" for c in ROLLOUT_COLUMNS]
    lines = ["def to_row(r):", "    return {", *(f"        {item}," for item in items), "    }"]
    built: Callable[[RolloutRecord], dict[str, Any]] = _Generated().compile("to_row", lines)
    return built


RowsBuilder = Callable[[Sequence[RolloutRecord], Any], list[tuple[Any, ...]]]


def row_tuples_builder(
    columns: Sequence[RolloutColumn], dumps: Callable[[Any], str]
) -> RowsBuilder:
    """A function ``(records, key) -> [(key, <columns[0]>, <columns[1]>, ...), ...]``.

    For a bulk insert (the registry: ``key`` is the run id); JSON values are
    serialised by ``dumps``. One list comprehension: CPython's fastest loop.
    """
    seen: set[str] = set()
    values = ", ".join(_read(c, seen, dumps=True) for c in columns)
    lines = ["def rows(records, key):", f"    return [(key, {values}) for r in records]"]
    built: RowsBuilder = _Generated(dumps).compile("rows", lines)
    return built


def _convert(column: RolloutColumn, value: str, *, decode_json: bool) -> str:
    if column.kind == "int":
        return f"opt_int({value})" if column.nullable else f"int({value})"
    if column.kind == "json" and decode_json:
        return f"loads({value})"
    return value


def _default(generated: _Generated, owner: type[Any], name: str) -> str | None:
    """The expression of the dataclass default of ``owner.name``; None: it has none."""
    spec = next(f for f in dataclasses.fields(owner) if f.name == name)
    label = f"default_{owner.__name__}_{name}"
    if spec.default is not dataclasses.MISSING:
        return generated.constant(label, spec.default)
    if spec.default_factory is not dataclasses.MISSING:
        return f"{generated.constant(label, spec.default_factory)}()"
    return None


def _json_field(
    generated: _Generated, column: RolloutColumn, mapping: str, owner: type[Any]
) -> str:
    default = _default(generated, owner, column.attr)
    if column.required or default is None:
        value = f"{mapping}[{column.attr!r}]"
    elif column.kind == "json":
        value = f"({mapping}.get({column.attr!r}) or {default})"  # null reads as empty
    else:
        value = f"{mapping}.get({column.attr!r}, {default})"
    return _convert(column, value, decode_json=False)


def _build_from_dict() -> Callable[[dict[str, Any]], RolloutRecord]:
    generated = _Generated()
    lines, arguments = ["def from_dict(d):"], []
    for column in ROLLOUT_COLUMNS:
        if column.part is None:
            value = _json_field(generated, column, "d", RolloutRecord)
            arguments.append(f"{column.name}={value}")
            continue
        if column is not part_columns(column.part)[0]:
            continue
        part, local, cls = column.part, f"p_{column.part}", PART_TYPES[column.part]
        fields = ", ".join(
            f"{c.attr}={_json_field(generated, c, local, cls)}" for c in part_columns(part)
        )
        if optional_part(part):
            lines.append(f"    {local} = d.get({part!r})")
            arguments.append(f"{part}=None if not {local} else Part_{part}({fields})")
        else:
            lines.append(f"    {local} = d.get({part!r}) or {{}}")
            arguments.append(f"{part}=Part_{part}({fields})")
    lines += ["    return Record(", *(f"        {a}," for a in arguments), "    )"]
    built: Callable[[dict[str, Any]], RolloutRecord] = generated.compile("from_dict", lines)
    return built


def record_builder(
    columns: Sequence[RolloutColumn], *, by_name: bool, decode_json: bool
) -> Callable[..., RolloutRecord]:
    """A function ``(values, *others) -> RolloutRecord`` reading a flat row.

    ``values`` holds ``columns``: a mapping by column name when ``by_name``, else a
    sequence in the order of ``columns``. The schema's other columns (e.g. the
    registry's per-run ``model``, ``sampling_args``) follow as arguments, in schema
    order. ``decode_json``: JSON columns hold text (else already decoded values).
    """
    position = {c.name: i for i, c in enumerate(columns)}
    others = [c.name for c in ROLLOUT_COLUMNS if c.name not in position]

    def raw(column: RolloutColumn) -> str:
        if column.name not in position:
            return column.name
        if not by_name:
            return f"v[{position[column.name]}]"
        if column.required or column.kind != "str" or column.nullable:
            # a column added to the schema later reads as null from an older file
            return f"v[{column.name!r}]" if column.required else f"v.get({column.name!r})"
        return f"(v.get({column.name!r}) or '')"

    def cell(column: RolloutColumn) -> str:
        if column.name not in position:
            return column.name
        return _convert(column, raw(column), decode_json=decode_json)

    arguments: list[str] = []
    for column in ROLLOUT_COLUMNS:
        if column.part is None:
            arguments.append(f"{column.name}={cell(column)}")
            continue
        members = part_columns(column.part)
        if column is not members[0]:
            continue
        built_part = f"Part_{column.part}({', '.join(f'{c.attr}={cell(c)}' for c in members)})"
        if optional_part(column.part):  # present when its first column is not null
            built_part = f"None if {raw(members[0])} is None else {built_part}"
        arguments.append(f"{column.part}={built_part}")
    lines = [
        f"def build(v{''.join(', ' + name for name in others)}):",
        "    return Record(",
        *(f"        {a}," for a in arguments),
        "    )",
    ]
    built: Callable[..., RolloutRecord] = _Generated().compile("build", lines)
    return built


_to_dict = _build_to_dict()
_to_json = _build_to_json()
_to_row = _build_to_row()
_from_dict = _build_from_dict()
_from_row: Callable[[dict[str, Any]], RolloutRecord] = record_builder(
    ROLLOUT_COLUMNS, by_name=True, decode_json=True
)


def _install(name: str, generated: Callable[..., Any]) -> None:
    """Make ``generated`` the method ``name`` itself, with the stub's name and docstring."""
    stub = getattr(RolloutRecord, name)
    for attribute in ("__name__", "__qualname__", "__module__", "__doc__"):
        setattr(generated, attribute, getattr(stub, attribute))
    setattr(RolloutRecord, name, generated)


_install("to_dict", _to_dict)
_install("to_json", _to_json)
_install("to_row", _to_row)
