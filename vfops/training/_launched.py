"""One process of a launched training run: ``python -m vfops.training._launched FOLDER``.

Started by :func:`vfops.training.train` (directly, or under ``accelerate
launch``), never by hand. ``FOLDER`` holds ``request.json`` (the config as
TOML-shaped data, the checkpoint to resume from); every rank trains, the main
rank appends progress events to ``progress.jsonl`` and writes ``result.json``
(atomically, when the run is done), and a failing rank writes
``errors/rankN.json`` (see :mod:`vfops.training._run`). Nothing is read from
this process's output.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from vfops._errors import VfopsError
from vfops.training._config import config_from_dict
from vfops.training._run import LaunchFiles, run_recipe


def main(argv: list[str]) -> int:
    files = LaunchFiles(Path(argv[0]))
    rank = int(os.environ.get("RANK", "0"))
    try:
        request: dict[str, Any] = json.loads(files.request.read_text())
        config = config_from_dict(request["config"], source=str(files.request)).validate()
        resume = Path(request["resume"]) if request.get("resume") else None
        result, main_process = run_recipe(config, resume, _ProgressWriter(files.progress))
        if main_process:
            _write_atomically(files.result, json.dumps(result.to_json()))
    except VfopsError as exc:
        # one line, reported by the launching process (not printed twice)
        _write_error(files, rank, exc, user_error=True)
        return exc.exit_code
    except BaseException as exc:
        _write_error(files, rank, exc, user_error=False)
        traceback.print_exc()
        return 1
    return 0


class _ProgressWriter:
    """``progress(kind, step, metrics)`` as one JSON line each, flushed at once."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __call__(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        line = json.dumps({"kind": kind, "step": step, "metrics": metrics})
        with self._path.open("a") as file:
            file.write(line + "\n")


def _write_error(files: LaunchFiles, rank: int, exc: BaseException, *, user_error: bool) -> None:
    error = {
        "rank": rank,
        "type": type(exc).__name__,
        "message": " ".join(str(exc).split()) or type(exc).__name__,
        "user_error": user_error,
        "exit_code": getattr(exc, "exit_code", 1),
    }
    _write_atomically(files.errors / f"rank{rank}.json", json.dumps(error))


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
