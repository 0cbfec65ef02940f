"""A run's ``rollouts.arrow``: an Arrow IPC stream of its rollout rows (pyarrow imported
on first use).

Written by the process that has the rows: the evaluation's Arrow sink
(:class:`vfops.evaluation._sinks.ArrowSink`) or, for a tracked ``vfops eval``, the
tracker process, which reads the rows from ``results.jsonl`` anyway (so the
evaluating process never imports pyarrow and numpy: ~40 MB and a few tenths of a
second of its core). Either way the stream is written under a partial name and takes
its final name only when complete: readers never see a torn file.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import orjson

from vfops._errors import VfopsError
from vfops._rollout import RolloutRecord, dumps_escaped


def export_problem(path: Path, exc: OSError) -> str:
    """The one-line problem of a write of ``path`` that failed (a full disk, a folder
    that refuses it), the same whichever process wrote it."""
    text = str(exc).strip()
    reason = exc.strerror or (text.splitlines()[0] if text else type(exc).__name__)
    return f"could not write {path} ({reason})"


def export_fix(resume: object) -> str:
    """What to do about :func:`export_problem`; ``resume``: the run's id (or folder)."""
    return (
        "make room in the output folder (or fix what refused the write), then finish "
        f"the run with vfops eval ... --resume {resume}"
    )


def partial_path(path: Path) -> Path:
    """Where the stream of ``path`` is written until it is complete."""
    return path.with_name(f".{path.name}.partial")


class ArrowStream:
    """An Arrow IPC stream of rollout rows (``RolloutRecord.to_row``) at ``path``."""

    def __init__(self, path: Path) -> None:
        import pyarrow as pa
        from pyarrow import json as arrow_json

        from vfops._rollout import rollout_arrow_schema

        self._json = arrow_json
        # Every field nullable, as in datasets' own schema: Dataset.from_file
        # (load_results) cannot read back an empty stream whose fields are not.
        self._schema = pa.schema([f.with_nullable(True) for f in rollout_arrow_schema()])
        self._file = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._file, self._schema)

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` as one record batch. They are built by pyarrow's JSON reader
        from the rows as JSON lines, not from Python objects: pyarrow imports pandas
        (most of a second on a small machine) the first time it converts Python
        objects, and its C++ reader is faster anyway."""
        try:
            lines = b"\n".join(orjson.dumps(row) for row in rows)
        except orjson.JSONEncodeError:  # a lone surrogate in a text column: escaped
            lines = b"\n".join(dumps_escaped(row) for row in rows)
        json = self._json
        table = json.read_json(
            io.BytesIO(lines),
            # one block: a row longer than the default block (1 MiB) is not refused
            read_options=json.ReadOptions(block_size=max(len(lines) + 1, 1 << 20)),
            # the explicit schema fixes types and column order (checked below)
            parse_options=json.ParseOptions(
                explicit_schema=self._schema, unexpected_field_behavior="error"
            ),
        )
        if not table.schema.equals(self._schema):
            raise VfopsError(f"the export's rows do not match the rollout schema: {table.schema}")
        self._writer.write_table(table)

    def close(self) -> None:
        try:
            self._writer.close()
        finally:
            self._file.close()


class ResultsExport:
    """``rollouts.arrow`` rebuilt from a run's ``results.jsonl`` lines, as they come
    (the tracker's export: synchronous, batched). The file holds each rollout once
    (the evaluation appends only groups it has not stored, a resume included), so no
    key set is kept: it would grow with the run.

    :meth:`add` takes complete JSON lines of records; :meth:`seal` writes the rest and
    gives the stream its final name. A write that fails raises :class:`OSError`.
    """

    def __init__(self, path: Path, *, batch_rows: int = 1024) -> None:
        self.path = path
        self._partial = partial_path(path)
        self._batch_rows = batch_rows
        self._rows: list[dict[str, Any]] = []
        self._stream: ArrowStream | None = None

    def add(self, records: list[RolloutRecord]) -> None:
        self._rows.extend(record.to_row() for record in records)
        if len(self._rows) >= self._batch_rows:
            self._flush()

    def _flush(self) -> None:
        if self._stream is None:
            self._stream = ArrowStream(self._partial)
        if self._rows:
            rows, self._rows = self._rows, []
            self._stream.write(rows)

    def seal(self) -> None:
        """Write what is buffered, close the stream (an empty run gets an empty one) and
        move it to its final name."""
        self._flush()
        assert self._stream is not None
        self._stream.close()
        os.replace(self._partial, self.path)
