"""Dataset normalisation: every environment sees rows of the same shape.

A formatted row has ``prompt`` (chat messages), ``answer`` (str), ``info`` (a
JSON string: Arrow cannot hold free-form dicts of different shapes across
environments), ``task`` (str) and ``example_id`` (int).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from vfops._errors import DatasetFormatError
from vfops._types import Info, Messages

if TYPE_CHECKING:
    from datasets import Dataset

FORMATTED_COLUMNS = ("prompt", "answer", "info", "task", "example_id")


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


def format_dataset(
    dataset: Dataset,
    *,
    env_name: str,
    system_prompt: str | None = None,
    few_shot: Messages | None = None,
    default_task: str = "default",
) -> Dataset:
    """Normalise a raw dataset to the formatted columns (see module docstring)."""
    columns = set(dataset.column_names)
    if "prompt" not in columns and "question" not in columns:
        raise DatasetFormatError(
            f"the dataset of environment '{env_name}' has neither a 'prompt' nor a "
            f"'question' column (columns: {sorted(columns)}); add one of them"
        )

    def normalise(row: dict[str, Any], index: int) -> dict[str, Any]:
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
            info = orjson.dumps(info, default=str).decode()
        example_id = row.get("example_id")
        return {
            "prompt": [_plain_message(m) for m in prompt],
            "answer": "" if row.get("answer") is None else str(row["answer"]),
            "info": info,
            "task": row.get("task") or default_task,
            "example_id": index if example_id is None else int(example_id),
        }

    drop = [c for c in dataset.column_names if c not in FORMATTED_COLUMNS]
    with quiet_datasets():
        return dataset.map(normalise, with_indices=True, remove_columns=drop)


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


def _plain_message(message: dict[str, Any]) -> dict[str, Any]:
    # Arrow fills absent struct keys with None; a chat server may reject those.
    plain = {k: v for k, v in message.items() if v is not None}
    plain.setdefault("content", "")
    return plain


def iter_examples(dataset: Dataset, n: int = -1, batch_size: int = 512) -> Iterator[Example]:
    """Yield the first ``n`` formatted rows (all when ``n < 0``) as :class:`Example`.

    Rows are read a batch at a time: Arrow-to-Python per column batch costs a
    fraction of per-row indexing, which matters at thousands of rollouts/s.
    """
    limit = len(dataset) if n < 0 else min(n, len(dataset))
    if limit < len(dataset):
        dataset = dataset.select(range(limit))
    for batch in dataset.iter(batch_size=batch_size):
        columns = list(batch)
        for index in range(len(batch[columns[0]])):
            yield example_from_row({name: batch[name][index] for name in columns})


def example_from_row(row: dict[str, Any]) -> Example:
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


def resolve_source(source: Any) -> Dataset | None:
    """A dataset source is a Dataset, a zero-argument builder, or None."""
    if source is None:
        return None
    if callable(source) and not hasattr(source, "column_names"):
        built: Dataset = source()
        return built
    dataset: Dataset = source
    return dataset
