"""The tracker's reading of a growing results.jsonl, in bounded slices, and the Arrow
export it writes from it (vfops/tracking/_results_tail.py, vfops/_arrow.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.registry_fixtures import make_record
from vfops._arrow import ResultsExport
from vfops._rollout import RolloutRecord
from vfops.tracking._results_tail import line_slices

LINES = [b"a" * n + b"\n" for n in (3, 40, 7, 120, 1, 9, 64)]  # one longer than a slice
DATA = b"".join(LINES)


@pytest.mark.parametrize("limit", [1, 16, 50, 1000])
@pytest.mark.parametrize("start_line", [0, 2, 5])
def test_slices_cover_exactly_the_range_each_ending_at_a_line(limit: int, start_line: int) -> None:
    start = sum(len(line) for line in LINES[:start_line])
    pieces = list(line_slices(io.BytesIO(DATA), start, len(DATA), limit))
    assert b"".join(pieces) == DATA[start:]
    assert all(piece.endswith(b"\n") for piece in pieces)
    for piece in pieces:  # bounded, except a line longer than the bound, which is whole
        assert len(piece) <= limit or piece.count(b"\n") == 1


def test_slices_stop_at_the_end_told_not_at_what_was_appended_since() -> None:
    end = len(LINES[0]) + len(LINES[1])
    assert b"".join(line_slices(io.BytesIO(DATA), 0, end, 16)) == DATA[:end]


def _record(example: int) -> RolloutRecord:
    return make_record(example, 0)


def test_the_export_takes_its_final_name_only_when_sealed(tmp_path: Path) -> None:
    from vfops.evaluation import load_results

    path = tmp_path / "rollouts.arrow"
    export = ResultsExport(path, batch_rows=3)
    export.add([_record(i) for i in range(5)])  # one batch written, two rows held
    partial = export.partial
    assert partial is not None and partial.exists() and not path.exists()
    assert partial.parent == path.parent  # beside it: the rename stays in one file system
    export.add([_record(5)])
    export.seal()
    assert path.exists() and not partial.exists() and export.partial is None
    rows = load_results(tmp_path)
    assert [row["example_id"] for row in rows] == list(range(6))


def test_an_empty_run_gets_an_empty_export(tmp_path: Path) -> None:
    from vfops.evaluation import load_results

    ResultsExport(tmp_path / "rollouts.arrow").seal()
    assert len(load_results(tmp_path)) == 0
