"""How long ``vfops eval`` takes to refuse: the CPU time of its whole process tree and the
wall time to its exit, for each refusal, in both virtualenvs (.venv: verifiers 0.3.1;
.venv-v1: verifiers 0.4.0, v1 tasksets), with the registry and MLflow tracking on as a
user has them. Optionally (``--accepted N``) an accepted run of the same kind, start to
exit against a local stub, for what the refusals' order costs it::

    .venv/bin/python bench/refusal_time.py                    # both venvs, 3 runs each
    .venv/bin/python bench/refusal_time.py --venv .venv-v1 --reps 5 --accepted 5
    .venv/bin/python bench/refusal_time.py --pythonpath /tmp/old  # another vfops tree

CPU is user + system of every process the command started, those that outlived it
included: this process makes itself their subreaper (Linux ``PR_SET_CHILD_SUBREAPER``),
so a child the command left running (a tracker started early) is waited for and
counted. ``--pythonpath DIR`` puts DIR first on the commands' ``PYTHONPATH``: a source
tree of another commit (``git archive COMMIT vfops | tar -x -C DIR``) runs in place of
the checkout's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
CLOSED = "http://127.0.0.1:9/v1"  # nothing listens there
# The endpoint is checked before the environment loads, so every case but the endpoint's
# own runs against a live stub serving `stub-model`: a closed URL would be refused first.
_PR_SET_CHILD_SUBREAPER = 36

# (name, arguments after `vfops eval`); -m and -b are added
CLASSIC = [
    ("bad -a value (vf_guess)", ["vf_guess", "-a", '{"stop_mode": "nope"}']),
    ("unknown environment", ["no_such_env"]),
    ("-n 0", ["vf_guess", "-n", "0"]),
    ("--temperature -1", ["vf_guess", "--temperature", "-1"]),
    ("-a not JSON", ["vf_guess", "-a", "{bad"]),
    ("endpoint unreachable", ["vf_guess", "-b", CLOSED]),
    ("model not served", ["vf_guess", "-m", "other-model"]),
]
V1 = [
    ("needs a container (image)", ["v1_needs_box"]),
    ("needs a container (class)", ["v1_needs_box", "-a", '{"image": null, "sealed": true}']),
    ("bad -a field (v1_arith)", ["v1_arith", "-a", '{"sizee": 3}']),
    ("unknown environment", ["no_such_env"]),
    ("-n 0", ["v1_arith", "-n", "0"]),
    ("--temperature -1", ["v1_arith", "--temperature", "-1"]),
    ("-a not JSON", ["v1_arith", "-a", "{bad"]),
    ("endpoint unreachable", ["v1_arith", "-b", CLOSED]),
]
ACCEPTED = {
    ".venv": ["arithmetic", "-a", '{"num_examples": 15}', "-n", "15", "-r", "1", "-c", "32"],
    ".venv-v1": ["v1_arith", "-n", "20", "-r", "1"],
}


@dataclass
class Timing:
    cpu_s: float
    wall_s: float
    tree_wall_s: float
    """Until the last process of the tree ended."""
    code: int
    stderr: str


def timed(argv: list[str], env: dict[str, str], cwd: Path, keep: set[int]) -> Timing:
    """``argv`` start to exit, its tree's CPU (children not in ``keep`` are reaped)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    for child in psutil.Process().children():
        if child.pid not in keep:  # orphans the command left, now ours: wait for them
            os.waitpid(child.pid, 0)
    tree_wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timing(cpu, wall, tree_wall, done.returncode, done.stderr)


def run_refusals(
    venv: Path, cases: list[tuple[str, list[str]]], reps: int, env: dict[str, str], live: str
) -> None:
    vfops = str(venv / "bin" / "vfops")
    print(f"\n{venv.name} (medians of {reps})")
    print(f"  {'refusal':<30} {'CPU s':>6}  {'wall s':>6}  {'tree wall s':>11}  stderr lines")
    keep = {child.pid for child in psutil.Process().children()}  # the stub
    for name, args in cases:
        runs: list[Timing] = []
        for _ in range(reps):
            work = Path(tempfile.mkdtemp(prefix="refusal-"))
            home = work / "home"
            try:
                # the case's own -m / -b come last and win (the CLI keeps the last one given)
                argv = [vfops, "eval", "-m", "stub-model", "-b", live, *args]
                runs.append(timed(argv, {**env, "VFOPS_HOME": str(home)}, work, keep))
                left = [p for p in work.rglob("*")]
            finally:
                shutil.rmtree(work, ignore_errors=True)
        last = runs[-1]
        lines = len(last.stderr.splitlines())
        first = (last.stderr.splitlines() or [""])[0]
        note = "" if last.code == 2 and lines == 1 else f"  (exit {last.code}; {first[:60]!r})"
        if left:
            note += f"  wrote {len(left)} paths"
        print(
            f"  {name:<30} {statistics.median(r.cpu_s for r in runs):6.2f}"
            f"  {statistics.median(r.wall_s for r in runs):6.2f}"
            f"  {statistics.median(r.tree_wall_s for r in runs):11.2f}  {lines}{note}"
        )


def run_accepted(venv: Path, reps: int, env: dict[str, str]) -> None:
    from vfops.testing import StubConfig, StubServer

    vfops = str(venv / "bin" / "vfops")
    work = Path(tempfile.mkdtemp(prefix="accepted-"))
    env = {**env, "VFOPS_HOME": str(work / "home")}
    try:
        with StubServer(StubConfig(reply_mode="arithmetic"), subprocess=True) as stub:
            keep = {child.pid for child in psutil.Process().children()}
            argv = [vfops, "eval", *ACCEPTED[venv.name], "-m", "stub-model", "-b", stub.base_url]
            runs = [timed(argv, env, work, keep) for _ in range(reps + 1)][1:]  # 1st: warm-up
        for run in runs:
            if run.code != 0:
                raise SystemExit(f"accepted run failed: {run.stderr[-2000:]}")
        walls = " ".join(f"{run.wall_s:.2f}" for run in runs)
        print(
            f"  accepted: {' '.join(ACCEPTED[venv.name])}: wall median "
            f"{statistics.median(r.wall_s for r in runs):.2f} s ({walls}), tree CPU median "
            f"{statistics.median(r.cpu_s for r in runs):.2f} s"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", action="append", help="default: .venv and .venv-v1")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--accepted", type=int, default=0, help="runs of an accepted eval")
    parser.add_argument("--pythonpath", help="a vfops source tree to run instead")
    args = parser.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a subreaper: orphans' CPU would not be counted")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VFOPS_", "MLFLOW_"))}
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath, env.get("PYTHONPATH")]))
    venvs = [REPO / name for name in (args.venv or [".venv", ".venv-v1"])]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; {os.cpu_count()} cores; python {sys.version.split()[0]}")
    from vfops.testing import StubConfig, StubServer

    for venv in venvs:
        if not (venv / "bin" / "vfops").exists():
            print(f"\n{venv.name}: not built (make setup / make setup-v1), skipped")
            continue
        with StubServer(StubConfig(), subprocess=True) as stub:
            cases = V1 if venv.name == ".venv-v1" else CLASSIC
            run_refusals(venv, cases, args.reps, env, stub.base_url)
        if args.accepted:
            run_accepted(venv, args.accepted, env)


if __name__ == "__main__":
    main()
