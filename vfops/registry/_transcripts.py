"""Transcripts of finished runs moved to Parquet in the artifact store.

The SQL registry keeps every rollout's summary (its key, reward, scores, error,
usage, cost, timing) for ever; its prompt and completion — ~1 KB for a single-turn
environment, ~10 KB for a tool environment, ~80 % of a rollout's bytes in PostgreSQL —
live there while the run is recent, and :func:`archive_run_transcripts` moves them,
for a completed run, to one Parquet file (zstd) in the artifact store (S3 in
production), referenced by ``eval_runs.transcripts_uri``. Readers do not change:
``iter_rollouts`` and ``rollouts_for_example`` fill an archived rollout's messages
from that file (downloaded once per reading call, verified against its content hash).

Why this split (measured by bench/registry_scale.py, bench/README.md): the summary is
what every registry command reads, the transcripts what a person reads one run at a
time. On the nightly-sweep workload a transcript takes 2,682 bytes in PostgreSQL
(TOAST, pglz) and 1,125 as Parquet, and the summary row left behind 302; a year
(~150M rollouts) is 0.54 TB of PostgreSQL with every transcript in it, or 0.12 TB
of PostgreSQL plus 0.15 TB of Parquet in object storage with the last 30 days'
transcripts kept in SQL. Writing stays transactional: a run writes its transcripts
to SQL as it goes (resumable, "exit means recorded"); only a completed run is
archived, after its file is stored and read back.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson
from sqlalchemy import null, select, tuple_, update
from sqlalchemy.orm import Session

from vfops._errors import VfopsError
from vfops.registry._models import ARCHIVED_COLUMNS, Base, EvalRunRow

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.artifacts import ArtifactStore

_ROLLOUTS: Final = Base.metadata.tables["rollouts"]
_PAGE: Final = 1000
_ROW_GROUP: Final = 256
"""Rollouts per Parquet row group: a reader of one rollout decodes at most this many."""
_FINISHED: Final = "completed"

Transcript = tuple[Any, Any]
"""(prompt, completion) as JSON values."""


class TranscriptArchiveError(VfopsError):
    """A run's transcripts could not be archived or read back."""


@dataclass(frozen=True, slots=True)
class ArchivedRun:
    """What :func:`archive_run_transcripts` did for one run."""

    run_id: str
    uri: str
    rollouts: int
    parquet_bytes: int


def archivable_runs(
    session: Session, *, finished_before: dt.datetime, limit: int = 1000
) -> list[str]:
    """Completed runs that finished before ``finished_before`` and still hold their
    transcripts in SQL, oldest first."""
    query = (
        select(EvalRunRow.id)
        .where(
            EvalRunRow.status == _FINISHED,
            EvalRunRow.transcripts_uri.is_(None),
            EvalRunRow.finished_at < finished_before,
        )
        .order_by(EvalRunRow.finished_at, EvalRunRow.id)
        .limit(limit)
    )
    return list(session.scalars(query))


def _transcript_pages(session: Session, run_id: str) -> Iterator[list[Any]]:
    c = _ROLLOUTS.c
    base = (
        select(c.example_id, c.rollout_index, c.prompt, c.completion)
        .where(c.run_id == run_id)
        .order_by(c.example_id, c.rollout_index)
        .limit(_PAGE)
    )
    last: tuple[int, int] | None = None
    while True:
        query = base if last is None else base.where(tuple_(c.example_id, c.rollout_index) > last)
        rows = list(session.execute(query).all())
        if rows:
            yield rows
        if len(rows) < _PAGE:
            return
        last = (rows[-1][0], rows[-1][1])


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("example_id", pa.int64()),
            ("rollout_index", pa.int64()),
            ("prompt", pa.large_string()),
            ("completion", pa.large_string()),
        ]
    )


def _write_parquet(session: Session, run_id: str, path: Path) -> int:
    """The run's transcripts as Parquet at ``path``; how many rollouts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    written = 0
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        for rows in _transcript_pages(session, run_id):
            if any(row[2] is None for row in rows):
                raise TranscriptArchiveError(
                    f"run {run_id} has rollouts without a transcript in the registry; "
                    "it was archived already (see eval_runs.transcripts_uri)"
                )
            columns = [
                [row[0] for row in rows],
                [row[1] for row in rows],
                [orjson.dumps(row[2]).decode() for row in rows],
                [orjson.dumps(row[3]).decode() for row in rows],
            ]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema), _ROW_GROUP)
            written += len(rows)
    return written


def archive_run_transcripts(engine: Engine, run_id: str, store: ArtifactStore) -> ArchivedRun:
    """Move a completed run's prompts and completions to Parquet in ``store``.

    The file is written from one read transaction, stored, downloaded again and
    checked (its hash and its rollouts' keys); only then, in one transaction, the run
    records its URI and its rollouts' transcripts are cleared — so a failure at any
    step leaves the run as it was, and running it again is safe.
    """
    from vfops.registry._db import session_scope

    with tempfile.TemporaryDirectory(prefix="vfops-transcripts-") as folder:
        local = Path(folder) / f"transcripts-{run_id}.parquet"
        with session_scope(engine, write=False) as session:
            run = session.get(EvalRunRow, run_id)
            _check_archivable(run_id, run)
            rollouts = _write_parquet(session, run_id, local)
        ref = store.put_file(local)
        # what a reader will get: the stored bytes, verified, with every key
        check = store.get_file(ref, Path(folder) / "check" / local.name)
        keys = _read_keys(check)
        with session_scope(engine) as session:
            taken = session.connection().execute(
                update(EvalRunRow)
                .where(
                    EvalRunRow.id == run_id,
                    EvalRunRow.status == _FINISHED,
                    EvalRunRow.transcripts_uri.is_(None),
                )
                .values(transcripts_uri=ref.uri)
            )
            if taken.rowcount != 1:
                raise TranscriptArchiveError(
                    f"run {run_id} changed while its transcripts were archived "
                    "(resumed, or archived by another process); nothing was cleared"
                )
            stored = _stored_keys(session, run_id)
            if stored != keys:
                raise TranscriptArchiveError(
                    f"run {run_id} has {len(stored)} rollouts in the registry but "
                    f"{len(keys)} in its archive; nothing was cleared, try again"
                )
            session.connection().execute(
                _ROLLOUTS.update()
                .where(_ROLLOUTS.c.run_id == run_id)
                .values({name: null() for name in ARCHIVED_COLUMNS})  # SQL NULL, not JSON null
            )
        return ArchivedRun(run_id, ref.uri, rollouts, local.stat().st_size)


def archive_finished_runs(
    engine: Engine, store: ArtifactStore, *, finished_before: dt.datetime, limit: int = 1000
) -> list[ArchivedRun]:
    """Archive the transcripts of completed runs that finished before ``finished_before``
    (oldest first, at most ``limit``): what ``vfops runs archive --older-than`` and the
    nightly sweep's ``archive_transcripts_after_days`` call."""
    from vfops.registry._db import session_scope

    with session_scope(engine, write=False) as session:
        chosen = archivable_runs(session, finished_before=finished_before, limit=limit)
    return [archive_run_transcripts(engine, run_id, store) for run_id in chosen]


def _check_archivable(run_id: str, run: EvalRunRow | None) -> None:
    if run is None:
        raise TranscriptArchiveError(f"no eval run with id {run_id!r}")
    if run.transcripts_uri is not None:
        raise TranscriptArchiveError(f"run {run_id} is archived already ({run.transcripts_uri})")
    if run.status != _FINISHED:
        raise TranscriptArchiveError(
            f"run {run_id} is {run.status}, not completed; finish it (vfops eval --resume) "
            "before archiving its transcripts"
        )


def _stored_keys(session: Session, run_id: str) -> set[tuple[int, int]]:
    # completed_keys' query; not imported from _rollouts.py, which imports this module
    c = _ROLLOUTS.c
    query = select(c.example_id, c.rollout_index).where(c.run_id == run_id)
    return {(int(a), int(b)) for a, b in session.execute(query)}


def _read_keys(path: Path) -> set[tuple[int, int]]:
    return set(_KeyIndex(path).position)


class _KeyIndex:
    """Where each rollout of an archive is: (row group, row in it), from the two key
    columns alone (``ParquetFile``, not ``read_table``: no ``pyarrow.dataset`` and
    pandas imported for a command that shows one rollout)."""

    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self.file = pq.ParquetFile(str(path))
        self.position: dict[tuple[int, int], tuple[int, int]] = {}
        for group in range(self.file.num_row_groups):
            keys = self.file.read_row_group(group, columns=["example_id", "rollout_index"])
            pairs = zip(keys.column(0).to_pylist(), keys.column(1).to_pylist(), strict=True)
            for row, key in enumerate(pairs):
                self.position[key] = (group, row)


def transcript_uris(session: Session) -> set[str]:
    """The transcript archives of every archived run (kept by the store's gc)."""
    query = select(EvalRunRow.transcripts_uri).where(EvalRunRow.transcripts_uri.is_not(None))
    return {str(uri) for uri in session.scalars(query)}


class ArchivedTranscripts:
    """The transcripts of archived runs, read from their Parquet files on demand.

    One per reading call: it downloads a run's file the first time one of its rollouts
    lacks its messages, and decodes one row group (256 rollouts) at a time, so showing
    one rollout of a 2,000-rollout tool run decodes 256 transcripts, not 2,000.
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._runs: dict[str, _KeyIndex] = {}
        self._group: tuple[str, int, list[str], list[str]] | None = None

    def get(self, run_id: str, example_id: int, rollout_index: int) -> Transcript:
        index = self._runs.get(run_id)
        if index is None:
            index = self._runs[run_id] = _KeyIndex(self._download(run_id))
        where = index.position.get((example_id, rollout_index))
        if where is None:
            raise TranscriptArchiveError(
                f"rollout ({example_id}, {rollout_index}) of run {run_id} is not in its "
                "transcript archive"
            )
        group, row = where
        if self._group is None or self._group[:2] != (run_id, group):
            table = index.file.read_row_group(group, columns=["prompt", "completion"])
            self._group = (run_id, group, table.column(0).to_pylist(), table.column(1).to_pylist())
        return orjson.loads(self._group[2][row]), orjson.loads(self._group[3][row])

    def _download(self, run_id: str) -> Path:
        from vfops.artifacts import open_uri

        uri = self._session.execute(
            select(EvalRunRow.transcripts_uri).where(EvalRunRow.id == run_id)
        ).scalar_one_or_none()
        if uri is None:
            raise TranscriptArchiveError(
                f"run {run_id} has rollouts without a transcript and no transcript archive"
            )
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="vfops-transcripts-")
        with open_uri(uri) as store:  # verified against the hash in its URI
            return store.get_file(uri, Path(self._folder.name) / run_id / "")

    def close(self) -> None:
        for index in self._runs.values():
            index.file.close()
        self._runs.clear()
        self._group = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
