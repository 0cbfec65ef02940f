"""A run's ``rollouts.arrow``: an Arrow IPC stream of its rollout rows (pyarrow imported
on first use).

Written by the process that has the rows: the evaluation's Arrow sink
(:class:`vfops.evaluation._sinks.ArrowSink`) or, for a tracked ``vfops eval``, the
tracker process, which reads the rows from ``results.jsonl`` anyway (so the
evaluating process never imports pyarrow and numpy: ~40 MB and a few tenths of a
second of its core). Either way the stream is written under a temporary name of its
writer's own (two writers never share a file), synced, and renamed to its final name
only when complete, the folder synced after: readers never see a torn file, and a
writer killed midway leaves only its temporary file, which the next writer removes.
A file damaged anyway (another tool, a disk) is found and rebuilt by
:func:`checked_export`.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

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
        lines = _json_lines(rows)
        json = self._json
        table = json.read_json(
            io.BytesIO(lines),
            read_options=json.ReadOptions(
                # one block: a row longer than the default block (1 MiB) is not refused
                block_size=max(len(lines) + 1, 1 << 20),
                # one block is parsed by one thread anyway; pyarrow's pool of CPU
                # threads would only add their memory to the tracker's
                use_threads=False,
            ),
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


def _json_lines(rows: list[dict[str, Any]]) -> bytearray:
    """``rows`` as JSON lines, appended one at a time: each row's ``orjson.dumps``
    result is freed at once (a join of them all would hold every one together, and
    orjson's results keep their initial ~8 KB buffer: 12 MB for a batch of ~800-byte
    rows, the tracker's largest transient)."""
    out = bytearray()
    for row in rows:
        out += dumps_escaped(row)  # a lone surrogate in a text column: escaped
        out += b"\n"
    return out


class ResultsExport:
    """``rollouts.arrow`` written in batches of rows, under its partial name until
    :meth:`seal`: the tracker's export (from a run's ``results.jsonl`` lines, as they
    come) and the evaluation's own Arrow sink (which runs :meth:`write` and
    :meth:`seal` in a worker thread). The file holds each rollout once (the evaluation
    appends only groups it has not stored, a resume included), so no key set is kept:
    it would grow with the run.

    :meth:`add` buffers records and writes a full batch; :meth:`buffer` and
    :meth:`take` let a caller write the batch elsewhere. A write that fails raises
    :class:`OSError`.
    """

    def __init__(self, path: Path, *, batch_rows: int = 1024) -> None:
        self.path = path
        self.partial: Path | None = None
        """Where the stream is written until it is sealed (once the first write made it)."""
        self._batch_rows = batch_rows
        self._rows: list[dict[str, Any]] = []
        self._stream: ArrowStream | None = None

    def buffer(self, records: list[RolloutRecord]) -> bool:
        """Keep ``records``' rows for the next batch; whether that batch is full."""
        self._rows.extend(record.to_row() for record in records)
        return len(self._rows) >= self._batch_rows

    def take(self) -> list[dict[str, Any]]:
        """The buffered rows, handed over (the buffer starts empty again)."""
        rows, self._rows = self._rows, []
        return rows

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` to the stream (opened by the first write)."""
        stream = self._open()
        if rows:
            stream.write(rows)

    def add(self, records: list[RolloutRecord]) -> None:
        if self.buffer(records):
            self.write(self.take())

    def seal(self) -> None:
        """Write what is buffered, close the stream (an empty run gets an empty one) and
        move it to its final name, synced: readers never see a torn file."""
        from vfops._atomic import publish

        self.write(self.take())
        self._open().close()
        assert self.partial is not None
        publish(self.partial, self.path)
        self.partial = None

    def discard(self) -> None:
        """Drop the unfinished stream (its writer is ending without a seal)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        if self.partial is not None:
            with contextlib.suppress(OSError):
                self.partial.unlink()
            self.partial = None

    def _open(self) -> ArrowStream:
        if self._stream is None:
            from vfops._atomic import remove_stale, temp_beside

            # what killed writers left (this one holds the folder: its lock, or its
            # tracker's), then a file of this writer's own
            remove_stale(self.path)
            self.partial = temp_beside(self.path)
            self._stream = ArrowStream(self.partial)
        return self._stream


class DamagedExport(VfopsError):
    """A ``rollouts.arrow`` that cannot be read back whole."""


def stream_rows(path: Path) -> int:
    """The number of rows of the Arrow stream at ``path``, every batch read (memory-mapped:
    nothing is copied); raises :class:`DamagedExport` naming what is wrong with it."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path), "r") as source:
            reader = pa.ipc.open_stream(source)
            rows = 0
            for batch in reader:
                batch.validate()
                rows += batch.num_rows
            return rows
    except (pa.ArrowException, OSError, ValueError) as exc:
        text = str(exc).strip()
        problem = text.splitlines()[0] if text else type(exc).__name__
        raise DamagedExport(f"{path} cannot be read ({problem})") from exc
