"""The ``rollouts.parquet`` artifact of an eval run's MLflow run.

Written either from the evaluation's own Arrow export of the whole run (a copy, no
registry read) or streamed from the registry, batch by batch, so memory does not grow
with the run; the streamed rollouts' statistics come back with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from vfops.stats import EvalSummary

ARTIFACT_NAME: Final = "rollouts.parquet"
_ROWS_PER_BATCH: Final = 1000


def write_rollouts_parquet(
    engine: Engine, run_id: str, path: Path, pass_threshold: float
) -> EvalSummary:
    """Stream the run's rollouts from the registry into ``path``; return their statistics."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vfops._rollout import rollout_arrow_schema
    from vfops.registry import iter_rollouts, session_scope
    from vfops.stats import EvalSummary

    schema = rollout_arrow_schema()
    summary = EvalSummary(pass_threshold=pass_threshold)
    batch: list[dict[str, Any]] = []
    with (
        pq.ParquetWriter(str(path), schema) as writer,
        session_scope(engine, write=False) as session,
    ):
        for record in iter_rollouts(session, run_id):
            summary.add(record, new=False)
            batch.append(record.to_row())
            if len(batch) >= _ROWS_PER_BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch or summary.rollouts == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return summary


def arrow_to_parquet(source: Path, target: Path) -> None:
    """Copy an Arrow IPC stream (the evaluation's ``rollouts.arrow``) into parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.OSFile(str(source), "rb") as handle:
        reader = pa.ipc.open_stream(handle)
        with pq.ParquetWriter(str(target), reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
