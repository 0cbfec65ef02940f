"""kill -9 of a tracked `vfops eval` at many points of a long run, each followed at once
by `--resume`, and every store counted: results.jsonl, rollouts.arrow (read as it is),
the registry and MLflow (run status, rollouts metric, rollouts.parquet artifact).

    .venv/bin/python bench/crash_matrix.py                       # 20,000 rollouts, the full matrix
    .venv/bin/python bench/crash_matrix.py --rollouts 2000 --points 0.3,1.0 --modes main
    .venv/bin/python bench/crash_matrix.py --db-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Modes: `main` (the evaluating process), `tree` (its whole process group), `tracker`
(the tracker child only). Points: the share of the rollouts on disk when the kill
comes (1.0: all of them, the run then sealing its export and finishing in MLflow).
Plus `--store-kills N`: the whole tree killed N times while the tracker creates the
embedded MLflow store (at growing sizes of its file), each followed by a new eval in
that home, which must exit 0 and be tracked. Prints a table; exits 1 if any case was
not exact.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.crash_harness import (  # noqa: E402  (the repository root on the path first)
    Outcome,
    crash_and_resume,
    kill_during_store_creation,
)
from vfops.testing import StubConfig, StubServer  # noqa: E402


def _site(folder: Path) -> Path:
    """The test environments (echo_env) installed for the CLI's PYTHONPATH."""
    site = folder / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(site), str(ROOT / "tests" / "fixtures" / "cli_envs")],
        check=True, capture_output=True,
    )  # fmt: skip
    return site


def _fresh_db(db_url: str | None, folder: Path, name: str) -> str:
    if db_url is None:
        return f"sqlite:///{folder / name / 'registry.db'}"
    return db_url  # runs are told apart by their id: one database serves every case


def _row(outcome: Outcome) -> str:
    counts = outcome.counts
    cells = [
        outcome.mode, outcome.at, str(outcome.killed_at_rows), str(outcome.first_exit),
        str(outcome.resume_exit), f"{outcome.resume_s:.1f}",
        str(counts.get("results.jsonl", "-")), str(counts.get("rollouts.arrow", "-")),
        str(counts.get("registry", "-")), str(counts.get("mlflow parquet", "-")),
        outcome.status or "-", outcome.mlflow_status or "-",
        "exact" if outcome.exact else "; ".join(outcome.problems),
    ]  # fmt: skip
    return " | ".join(cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20_000)
    parser.add_argument("--per-example", type=int, default=2, help="-r of the eval")
    parser.add_argument("--modes", default="main,tree,tracker")
    parser.add_argument("--points", default="0.0,0.1,0.25,0.5,0.75,0.9,0.99,1.0")
    parser.add_argument("--store-kills", type=int, default=5)
    parser.add_argument("--db-url", default=None, help="default: a fresh SQLite per case")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    options = parser.parse_args()
    examples = options.rollouts // options.per_example
    work = Path(tempfile.mkdtemp(prefix="vfops-crash-matrix-"))
    site = _site(work)
    header = ("mode | at | killed at rows | first exit | resume exit | resume s | "
              "results.jsonl | rollouts.arrow | registry | mlflow parquet | status | "
              "mlflow | verdict")  # fmt: skip
    print(header)
    print("-" * len(header))
    failures = 0
    started = time.monotonic()
    with StubServer(StubConfig(reply_mode="echo_answer", latency_ms=options.latency_ms)) as stub:
        for mode in options.modes.split(","):
            for point in (float(p) for p in options.points.split(",")):
                case = work / f"{mode}-{point}"
                outcome = crash_and_resume(
                    case,
                    db_url=_fresh_db(options.db_url, work, case.name),
                    site=site,
                    base_url=stub.base_url,
                    mode=mode,  # type: ignore[arg-type]
                    at_fraction=point,
                    examples=examples,
                    rollouts=options.per_example,
                )
                failures += not outcome.exact
                print(_row(outcome), flush=True)
                if not outcome.exact:
                    print("    resume stderr: " + outcome.stderr.replace("\n", "\n    "))
        for number in range(options.store_kills):
            case = work / f"store-{number}"
            grown = 120_000 + number * 180_000  # from the first tables to the last migrations
            first, outcome = kill_during_store_creation(
                case, db_url=_fresh_db(options.db_url, work, case.name), site=site,
                base_url=stub.base_url, examples=20, grown_to=grown,
            )  # fmt: skip
            outcome.at = f"store >= {grown // 1000} KB"
            outcome.first_exit = first
            failures += not outcome.exact
            print(_row(outcome), flush=True)
            if not outcome.exact:
                print("    next eval stderr: " + outcome.stderr.replace("\n", "\n    "))
    print(f"\n{failures} case(s) not exact; {time.monotonic() - started:.0f} s; work in {work}")
    if not options.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
