"""K gated ``vfops promote`` processes at once on one alias: one champion, and a history
whose every move names the holder it replaced (issue 44, item 5)::

    .venv/bin/python bench/promotion_race.py               # K = 2, 3, 4; SQLite, PostgreSQL
    .venv/bin/python bench/promotion_race.py --k 4 --reps 3 --dialects sqlite
    .venv/bin/python bench/promotion_race.py --no-barrier  # let them race as they come

A tiny CPU model registered K + 1 times (v1 the champion; v2.. shorter replies, better on
the brevity gate), then K ``vfops promote race vN`` processes started together. With the
barrier (``VFOPS_TEST_PROMOTION_BARRIER``, the default) every one has gated against v1
before any moves. Each row: the dialect, K, the history (from->to outcome, in order), how
many gate rounds each process ran, the exit codes, the seconds, and ``ok`` when the
moves form one chain (each from the holder the one before left, no holder replaced
twice) that ends at MLflow's holder. The embedded MLflow store (SQLite); the registry
on SQLite or PostgreSQL (a fresh schema per row, at VFOPS_TEST_PG_URL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PG_URL = os.environ.get("VFOPS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
GATE = ["-e", "brevity_gate", "-n", "6", "-r", "1", "-T", "0", "--json"]
ENV_MODULE = """
from datasets import Dataset

import vfops


def load_environment() -> vfops.Environment:
    def brevity(completion) -> float:
        return 1.0 / (1.0 + len(completion[-1]["content"] if completion else ""))

    rows = [{"question": f"Tell me about item {i}.", "answer": ""} for i in range(12)]
    return vfops.SingleTurnEnv(
        eval_dataset=Dataset.from_list(rows), rubric=vfops.Rubric(funcs=[brevity])
    )
"""


def gate_site(root: Path) -> Path:
    site = root / "site"
    dist = site / "brevity_gate_env-0.0.1.dist-info"
    dist.mkdir(parents=True)
    (site / "brevity_gate_env.py").write_text(textwrap.dedent(ENV_MODULE))
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: brevity-gate-env\nVersion: 0.0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[vfops.environments]\nbrevity_gate = brevity_gate_env:load_environment\n"
    )
    return site


def vfops(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vfops", *args], env=env, capture_output=True, text=True, check=False
    )


def registry_url(dialect: str, root: Path) -> tuple[str, str | None]:
    if dialect == "sqlite":
        return f"sqlite:///{root / 'registry.db'}", None
    from sqlalchemy import create_engine, text

    schema = f"vfops_bench_{uuid.uuid4().hex[:12]}"
    with create_engine(PG_URL).begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    return f"{PG_URL}?options=-csearch_path%3D{schema}", schema


def drop_schema(schema: str | None) -> None:
    if schema is not None:
        from sqlalchemy import create_engine, text

        with create_engine(PG_URL).begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def one_race(dialect: str, k: int, base: Path, site: Path, barrier_on: bool) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="vfops-promotion-race-"))
    url, schema = registry_url(dialect, root)
    env = {
        **os.environ,
        "VFOPS_HOME": str(root / "home"),
        "VFOPS_DATABASE_URL": url,
        "VFOPS_TRACKING": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        for i in range(k + 1):  # v1 replies in 16 tokens, each next one in fewer
            folder = root / f"v{i + 1}"
            shutil.copytree(base, folder)
            config = json.loads((folder / "generation_config.json").read_text())
            config["max_new_tokens"] = max(1, 16 - 3 * i)
            (folder / "generation_config.json").write_text(json.dumps(config))
            done = vfops(env, "model", "register", str(folder), "--name", "race")
            assert done.returncode == 0, done.stderr
        first = vfops(env, "promote", "race", "1", *GATE)
        assert first.returncode == 0, first.stderr
        barrier = root / "barrier"
        barrier.mkdir()
        if barrier_on:
            env["VFOPS_TEST_PROMOTION_BARRIER"] = str(barrier)
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "vfops", "promote", "race", str(v), *GATE],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for v in range(2, k + 2)
        ]
        if barrier_on:
            deadline = time.monotonic() + 600
            while len(list(barrier.glob("ready-*"))) < k and time.monotonic() < deadline:
                if any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.05)
            (barrier / "go").touch()
        outputs = [p.communicate(timeout=900) for p in procs]
        seconds = time.monotonic() - started
        history = json.loads(vfops(env, "promote", "history", "race", "--json").stdout)
        champion = current_holder(env)
        regated = [holders_replaced(decision_of(out).get("reason", "")) for out, _ in outputs]
        return {
            "dialect": dialect,
            "k": k,
            "history": [f"{e['from_version']}->{e['to_version']} {e['outcome']}" for e in history],
            "regated": regated,
            "exits": [p.returncode for p in procs],
            "errors": [err.strip().splitlines()[-1] for _, err in outputs if err.strip()][:3],
            "seconds": round(seconds, 1),
            "ok": chain_ok(history, champion),
        }
    finally:
        drop_schema(schema)
        shutil.rmtree(root, ignore_errors=True)


def holders_replaced(reason: str) -> int:
    """How many times a promotion gated again: the holders its reason says changed."""
    marker = "the holder changed while the gate ran ("
    if marker not in reason:
        return 0
    return reason.split(marker, 1)[1].split(")", 1)[0].count(" -> ")


def decision_of(stdout: str) -> dict[str, Any]:
    if "{\n" not in stdout:
        return {}
    decision: dict[str, Any] = json.loads(stdout[stdout.index("{\n") :])
    return decision


def current_holder(env: dict[str, str]) -> str:
    code = (
        "from vfops.tracking import mlflow_client;"
        "print(mlflow_client().get_model_version_by_alias('race', 'champion').version)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def chain_ok(history: list[dict[str, Any]], champion: str) -> bool:
    moves = [e for e in history if e["outcome"] in ("promoted", "external")]
    froms = [m["from_version"] for m in moves]
    chained = froms == [None, *(m["to_version"] for m in moves[:-1])]
    return chained and len(set(froms)) == len(froms) and moves[-1]["to_version"] == champion


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--dialects", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--no-barrier", action="store_true")
    args = parser.parse_args()
    from vfops.local import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="vfops-promotion-race-base-") as tmp:
        base = build_tiny_model(Path(tmp) / "base", seed=3)
        site = gate_site(Path(tmp))
        for dialect in args.dialects:
            for k in args.k:
                for _ in range(args.reps):
                    row = one_race(dialect, k, base, site, not args.no_barrier)
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
