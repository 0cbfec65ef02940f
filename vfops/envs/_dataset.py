"""Dataset normalisation: every environment sees rows of the same shape.

A formatted row has ``prompt`` (chat messages), ``answer`` (str), ``info`` (a
JSON string: Arrow cannot hold free-form dicts of different shapes across
environments), ``task`` (str) and ``example_id`` (int).

A split's source is a ``datasets.Dataset`` or plain rows (a sequence of
mappings). Plain rows are formatted in plain Python and stay plain rows
(:class:`FormattedRows`: each checked when the split is built, formatted again when
it is read), so evaluating such an environment never imports ``datasets`` (about a
second of start-up) and never holds a second copy of its rows (50,000 rows of
``arithmetic`` formatted at once were ~37 MB of the evaluating process); a Dataset is
formatted with ``Dataset.map`` and stays a Dataset. Rows that only the split holds (its
builder returned them) are kept packed (:class:`PackedRows`: one JSON text per row in
one buffer, ~5x smaller than the dicts: 50,000 rows of ``arithmetic`` are 4 MB, not 25).
"""

from __future__ import annotations

import array
import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard, overload

import orjson

from vfops._errors import DatasetFormatError
from vfops._rollout import dumps_escaped
from vfops._types import Info, Messages

if TYPE_CHECKING:
    from datasets import Dataset

#: Plain rows, as an environment's dataset builder may return them.
Rows: TypeAlias = Sequence[Mapping[str, Any]]
#: What a split is built from: a Dataset, plain rows, or a zero-argument builder of either.
DatasetSource: TypeAlias = "Dataset | Rows | Callable[[], Dataset | Rows]"
#: A formatted split: formatted rows when built from plain rows, else a Dataset.
FormattedSplit: TypeAlias = "Dataset | Sequence[dict[str, Any]]"
#: The row normaliser: a raw row and its index to a formatted row.
Normaliser: TypeAlias = Callable[[Mapping[str, Any], int], dict[str, Any]]

_FRESH = "__vfops_formatted__"  # prefix of the columns map writes (see _map_dataset)


@dataclass(slots=True)
class Example:
    """One dataset row, ready to roll out."""

    example_id: int
    prompt: Messages
    answer: str = ""
    info: Info = field(default_factory=dict)
    task: str = "default"


def build_prompt(question: str, system_prompt: str | None, few_shot: Messages | None) -> Messages:
    messages: Messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend(few_shot or [])
    messages.append({"role": "user", "content": question})
    return messages


def is_dataset(data: object) -> TypeGuard[Dataset]:
    """Whether ``data`` is a ``datasets.Dataset``, asked without importing ``datasets``.

    No Dataset can exist before ``datasets`` is imported, so its absence from
    ``sys.modules`` answers no for free.
    """
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(data, datasets.Dataset)


def format_dataset(
    dataset: Dataset | Rows,
    *,
    env_name: str,
    system_prompt: str | None = None,
    few_shot: Messages | None = None,
    default_task: str = "default",
    owned: bool = False,
) -> FormattedSplit:
    """Normalise a raw split to the formatted columns (see module docstring).

    A Dataset comes back as a Dataset (``Dataset.map``); plain rows come back as
    :class:`FormattedRows`, built without importing ``datasets``. Both go through the
    same row normaliser, so they give the same rows and errors. ``owned``: nothing else
    holds the plain rows (a builder just returned them), so they may be kept packed.
    """
    columns = column_names(dataset, env_name)
    if "prompt" not in columns and "question" not in columns:
        raise DatasetFormatError(
            f"the dataset of environment '{env_name}' has neither a 'prompt' nor a "
            f"'question' column (columns: {sorted(columns)}); add one of them"
        )
    normalise = row_normaliser(
        set(columns),
        env_name=env_name,
        system_prompt=system_prompt,
        few_shot=few_shot,
        default_task=default_task,
    )
    if is_dataset(dataset):
        return _map_dataset(dataset, normalise)
    return FormattedRows(dataset, normalise, pack=owned)


class _RowSequence(Sequence[dict[str, Any]]):
    """A sequence of rows, each made when it is read (:meth:`_row`): indexing, slices
    and bounds once for both kinds below."""

    def _row(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._row(index)


class FormattedRows(_RowSequence):
    """Plain rows seen formatted: every row is normalised once here, so a bad row is
    one line before any run starts, and then again each time it is read (a formatted
    row is a few new dicts; the split keeps only its raw rows). ``pack``: keep them as
    :class:`PackedRows` where each survives JSON unchanged (the caller's rows are then
    dropped: only for rows nothing else holds, else they would be held twice)."""

    def __init__(self, rows: Rows, normalise: Normaliser, *, pack: bool = False) -> None:
        for index, row in enumerate(rows):
            normalise(row, index)
        self._rows: Rows = (PackedRows.pack(rows) if pack else None) or rows
        self._normalise = normalise

    def __len__(self) -> int:
        return len(self._rows)

    def _row(self, index: int) -> dict[str, Any]:
        return self._normalise(self._rows[index], index)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return map(self._normalise, self._rows, itertools.count())


def column_names(dataset: Dataset | Rows, env_name: str) -> list[str]:
    """A Dataset's columns, or every key any of the plain rows has (first seen first)."""
    if is_dataset(dataset):
        return list(dataset.column_names)
    if isinstance(dataset, (str, bytes)) or not isinstance(dataset, Sequence):
        raise DatasetFormatError(
            f"the dataset of environment '{env_name}' is a {type(dataset).__name__}; give a "
            "datasets.Dataset, a list of row dicts, or a zero-argument callable returning one"
        )
    columns: dict[str, None] = {}
    for index, row in enumerate(dataset):
        if not isinstance(row, Mapping):
            raise DatasetFormatError(
                f"row {index} of environment '{env_name}' is a {type(row).__name__}, "
                "not a dict of column values; make every row a dict"
            )
        columns.update(dict.fromkeys(row))
    return list(columns)


def row_normaliser(
    columns: set[str],
    *,
    env_name: str,
    system_prompt: str | None,
    few_shot: Messages | None,
    default_task: str,
) -> Normaliser:
    """The one row normaliser, for Dataset rows (``map``) and plain rows alike."""

    def normalise(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        if row.get("prompt") is not None and "prompt" in columns:
            prompt = row["prompt"]
            if isinstance(prompt, str):
                prompt = build_prompt(prompt, system_prompt, few_shot)
            elif system_prompt and (not prompt or prompt[0].get("role") != "system"):
                prompt = [{"role": "system", "content": system_prompt}, *prompt]
        else:
            question = row.get("question")
            if question is None:
                raise DatasetFormatError(
                    f"row {index} of environment '{env_name}' has no 'prompt' or 'question'"
                )
            prompt = build_prompt(str(question), system_prompt, few_shot)
        info = row.get("info")
        if info is None:
            info = "{}"
        elif not isinstance(info, str):
            info = dumps_escaped(info).decode()  # a lone surrogate is kept, escaped
        example_id = row.get("example_id")
        return {
            "prompt": [_plain_message(m) for m in prompt],
            "answer": "" if row.get("answer") is None else str(row["answer"]),
            "info": info,
            "task": row.get("task") or default_task,
            "example_id": index if example_id is None else int(example_id),
        }

    return normalise


def _map_dataset(dataset: Dataset, normalise: Normaliser) -> Dataset:
    # map keeps an input column's type when the output still casts to it (an int
    # ``answer`` would stay int64, and answer 0 read back as ""), so the rows are
    # written under fresh names and renamed back: their types are inferred anew.
    def fresh(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        return {_FRESH + name: value for name, value in normalise(row, index).items()}

    with quiet_datasets():
        mapped = dataset.map(fresh, with_indices=True, remove_columns=dataset.column_names)
    return mapped.rename_columns({name: name[len(_FRESH) :] for name in mapped.column_names})


def rows_to_dataset(rows: Sequence[dict[str, Any]]) -> Dataset:
    """Formatted plain rows as a Dataset, for the callers that need one (training, export)."""
    from datasets import Dataset

    return Dataset.from_list(list(rows))


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Silence ``datasets`` progress bars for internal bookkeeping (map, save)."""
    from datasets.utils import logging as ds_logging

    was_enabled = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            ds_logging.enable_progress_bar()


def _plain_message(message: Mapping[str, Any]) -> dict[str, Any]:
    # Arrow fills absent struct keys with None; a chat server may reject those.
    plain = {k: v for k, v in message.items() if v is not None}
    plain.setdefault("content", "")
    return plain


class PackedRows(_RowSequence):
    """Plain rows held as their JSON texts, end to end in one buffer, each read back as
    a new dict (``orjson``: ~1 us a row). A row is a dict of a few small objects,
    ~500 bytes for ``arithmetic``'s; its JSON is ~80: what a split of 50,000 rows holds
    for the whole evaluation, in the evaluating process and every process forked from
    it before it is dropped."""

    def __init__(self, data: bytearray, ends: array.array[int]) -> None:
        self._data = data
        self._ends = ends

    @classmethod
    def pack(cls, rows: Rows) -> PackedRows | None:
        """``rows`` packed; None when one of them would not read back equal (a value JSON
        does not hold as it is: a tuple, bytes, a date, a non-string key, NaN)."""
        data, ends = bytearray(), array.array("Q")
        for row in rows:
            try:
                text = orjson.dumps(row)
            except TypeError:  # orjson.JSONEncodeError is one
                return None
            if orjson.loads(text) != row:
                return None
            data += text
            ends.append(len(data))
        return cls(data, ends)

    def __len__(self) -> int:
        return len(self._ends)

    def _row(self, index: int) -> dict[str, Any]:
        start = self._ends[index - 1] if index else 0
        row: dict[str, Any] = orjson.loads(memoryview(self._data)[start : self._ends[index]])
        return row

    def __iter__(self) -> Iterator[dict[str, Any]]:
        view, start = memoryview(self._data), 0
        for end in self._ends:
            yield orjson.loads(view[start:end])
            start = end


def iter_examples(dataset: Dataset | Rows, n: int = -1, batch_size: int = 512) -> Iterator[Example]:
    """Yield the first ``n`` formatted rows (all when ``n < 0``) as :class:`Example`.

    Plain formatted rows are read directly. A Dataset is read a batch at a time:
    Arrow-to-Python per column batch costs a fraction of per-row indexing, which
    matters at thousands of rollouts/s.
    """
    if is_dataset(dataset):
        yield from _iter_dataset(dataset, n, batch_size)
    else:
        yield from map(example_from_row, itertools.islice(dataset, None if n < 0 else n))


def _iter_dataset(dataset: Dataset, n: int, batch_size: int) -> Iterator[Example]:
    limit = len(dataset) if n < 0 else min(n, len(dataset))
    if limit < len(dataset):
        dataset = dataset.select(range(limit))
    for batch in dataset.iter(batch_size=batch_size):
        columns = list(batch)
        for index in range(len(batch[columns[0]])):
            yield example_from_row({name: batch[name][index] for name in columns})


def example_from_row(row: Mapping[str, Any]) -> Example:
    info = row.get("info") or {}
    if isinstance(info, str):
        info = orjson.loads(info) if info else {}
    return Example(
        example_id=int(row["example_id"]),
        prompt=[_plain_message(m) for m in row["prompt"]],
        answer=row.get("answer") or "",
        info=info,
        task=row.get("task") or "default",
    )


def resolve_source(source: DatasetSource | None) -> Dataset | Rows | None:
    """A split's source is a Dataset, plain rows, a zero-argument builder of either, or None."""
    if source is None:
        return None
    if callable(source):
        built: Dataset | Rows | None = source()
        return built
    return source
