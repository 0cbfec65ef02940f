"""Reading a run's ``results.jsonl`` while the evaluation appends to it (the tracker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO


def line_slices(handle: IO[bytes], start: int, end: int, limit: int) -> Iterator[bytes]:
    """The bytes of ``handle`` from ``start`` to ``end`` (a line's end), in pieces of at
    most ``limit`` bytes that each end at a line's end (a line longer than ``limit`` is
    one piece)."""
    handle.seek(start)
    offset = start
    while offset < end:
        piece = handle.read(min(end - offset, limit))
        if not piece:
            return  # shorter than told: what is there is read next time
        if offset + len(piece) < end:
            cut = piece.rfind(b"\n") + 1
            if cut == 0:
                piece += handle.readline()
            else:
                piece = piece[:cut]
                handle.seek(offset + cut)
        offset += len(piece)
        yield piece
