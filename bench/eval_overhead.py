"""Eval overhead benchmark: the bars of "one evaluation path", measured as a user runs it.

Every figure is of a whole ``vfops eval`` process, start to exit, with the
defaults on (registry in SQLite under a bench-private ``VFOPS_HOME``, MLflow
tracking in its SQLite store there with the default share of traces, recorded by
the tracker child process while the rollouts run), next to the rollout-phase
figure that vfops records itself (``summary.wall_s`` in the run's
``metadata.json``). ``vfops eval`` exits only once the run is recorded, so every
vfops run is checked right after its exit, outside the timed part, from a short
``python -c`` of its own (the bench never imports MLflow): "recorded at exit" =
the newest ``eval_runs`` row of the registry is this run's, ``completed``, with an
``mlflow_run_id``, and that MLflow run is ``FINISHED`` with metrics ``rollouts``
(= N x R) and ``reward_mean``, the ``rollouts.parquet`` artifact and min(N x R,
100) traces. A bar fails when its run was not recorded at exit, or when a process
of its tree outlived the ``vfops`` process (none may: that is a bug now). The model
is the stub server (``vfops.testing.StubServer``, reply mode ``arithmetic``, one
subprocess per latency); the environment is ``arithmetic``. ``vf-eval`` (verifiers
``VERIFIERS_VERSION``, in ``.bench/verifiers-venv``, created on first use) runs
``bench/vf_arithmetic`` (the same questions, parser and rewards on verifiers'
legacy ``vf.SingleTurnEnv``) with the same N, R, concurrency and max_tokens
against the same stub. ``vfops eval vf_arithmetic`` (tool ``vfops-vf``) runs that
very package through vfops' verifiers adapter: installed with ``pip install
--no-deps --target .bench/vf-envs`` (the project venv is left alone) and put on
that process's ``PYTHONPATH`` only, with the project venv's ``verifiers``.

Parts (``--only`` runs a subset):

throughput  bar 1: 2,000 rollouts (-n 1000 -r 2), -c 128, stub latency 200 ms
            (bound C/latency = 640/s): vfops end-to-end (everything recorded at
            exit) >= 75 % of the bound, rollout phase >= 90 %, end-to-end >= 10x
            vf-eval's. Also CPU ms per rollout (all-in and marginal) and a
            -n 1 -r 1 start-up run per tool. Also vfops-vf (vfops on the
            verifiers package) with bar 1d: its end-to-end rate >= 5x
            vf-eval's (issue 15).
verifiers-adapter  only the rows of bar 1d: vfops-vf and vf-eval, the
            throughput workload (part of ``throughput``; this runs just them).
short       bar 2: a 15-rollout eval (-n 5 -r 3), 0 ms stub, on a home used
            before, recorded at exit: <= 2.5 s wall (median of --repeats runs
            after one warm-up run per variant), next to the same with
            --no-tracking and vf-eval's figure.
memory      bar 3: 100,000 rollouts (-n 50000 -r 2 -a '{"num_examples": 50000}'),
            -c 256, 0 ms stub: peak RSS of the whole process tree (vfops + its
            tracker child, which serves its registry calls too, sampled together) <= 300 MB (the
            vfops process's own peak reported next to it), and <= 3 s from the
            last rollout to the process exit, recorded.

    .venv/bin/python bench/eval_overhead.py          # all parts: a few minutes on 2 cores
    .venv/bin/python bench/eval_overhead.py --quick  # smoke run: small sizes
    .venv/bin/python bench/eval_overhead.py --only short --json out.json
    .venv/bin/python bench/eval_overhead.py --only verifiers-adapter
    .venv/bin/python bench/eval_overhead.py --skip-verifiers
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

# bench/ is sys.path[0] when run as a script
from _venvs import ensure_target, ensure_venv, venv_versions

from vfops.testing import StubConfig, StubServer

VERIFIERS_VERSION = "0.3.1"
"""verifiers 0.4.0 replaced the legacy ``vf-eval`` (env modules with
``load_environment``; -n/-r/-c/-b/-k flags) by a taskset CLI; 0.3.1 is the last
release whose ``vf-eval`` runs a ``vf.SingleTurnEnv`` module like vfops' envs."""

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
VF_VENV = BENCH_DIR / "verifiers-venv"
VF_ENV_DIR = ROOT / "bench" / "vf_arithmetic"
VF_ENVS = BENCH_DIR / "vf-envs"
"""``vf_arithmetic`` installed with ``pip install --no-deps --target`` for ``vfops-vf``: on
that process's PYTHONPATH only (importlib.metadata finds its .dist-info there)."""
VFOPS_BIN = Path(sys.executable).parent / "vfops"
API_KEY_VAR = "BENCH_DUMMY_API_KEY"
MODEL = "stub-model"
MAX_TOKENS = 256
SAMPLE_INTERVAL_S = 0.1
PARTS = ("throughput", "verifiers-adapter", "short", "memory")
DEFAULT_PARTS = ("throughput", "short", "memory")
"""``verifiers-adapter`` is a subset of ``throughput`` (its rows only)."""
VFOPS_TOOLS = ("vfops", "vfops-vf")
"""vfops on its own ``arithmetic``, and on the verifiers package ``vf_arithmetic``."""

# The bars, as the issue states them.
BAR_LATENCY_MS = 200.0
BAR_THROUGHPUT = {"n": 1000, "r": 2, "c": 128}
BAR_E2E_FRACTION = 0.75
BAR_PHASE_FRACTION = 0.90
BAR_VS_VF_EVAL = 10.0
BAR_ADAPTER_VS_VF_EVAL = 5.0
"""Issue 15: vfops eval of a verifiers environment >= 5x vf-eval's rollouts/s on it."""
BAR_REWARD = 1.2
"""Every rollout's reward against the stub's ``arithmetic`` replies (answer 1.0 + format 0.2)."""
BAR_SHORT = {"n": 5, "r": 3}
BAR_SHORT_WALL_S = 2.5
"""Issue 25: recorded at exit (was 1.5 s when the MLflow run was logged after the exit)."""
BAR_MEMORY = {"n": 50000, "r": 2, "c": 256}
BAR_PEAK_RSS_MB = 300.0
"""Issue 25: of the whole process tree (vfops + its tracker child, serving the registry too)."""
BAR_TAIL_S = 3.0
SHORT_CONCURRENCY = 32
"""``vfops eval``'s default -c, passed explicitly so both tools run with it."""
TRACES_PER_RUN = 100
"""The default share of traces (``VFOPS_TRACE_ROLLOUTS`` unset): at most 100 passing
rollouts per run; every stub rollout passes, so a run has min(N x R, 100) traces."""
RECORDED_ARTIFACT = "rollouts.parquet"
RECORDED_CHECK_TIMEOUT_S = 300.0
SURVIVOR_WAIT_S = 60.0
"""How long the bench waits for a process that outlived its client before it ends it."""

# Variables that would move vfops off its defaults (or point it at the user's stores).
_SCRUBBED_ENV = (
    "MLFLOW_TRACKING_URI",
    "VFOPS_DATABASE_URL",
    "VFOPS_TRACKING",
    "VFOPS_ARTIFACTS",
    "VFOPS_MLFLOW_ARTIFACTS",
    "VFOPS_TRACE_ROLLOUTS",  # the test suite turns traces off; the bars are with them
)
_TICKS = os.sysconf("SC_CLK_TCK")
_PROC_CHILDREN = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


# ---------------------------------------------------------------- setup


def _stamp() -> str:
    import hashlib

    digest = hashlib.sha256(VERIFIERS_VERSION.encode())
    for path in sorted(VF_ENV_DIR.glob("*")):
        if path.is_file():
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def ensure_verifiers_venv() -> Path:
    """Create ``.bench/verifiers-venv`` with verifiers + vf_arithmetic (cached)."""
    ensure_venv(
        VF_VENV,
        [[f"verifiers=={VERIFIERS_VERSION}"], ["-e", str(VF_ENV_DIR)]],
        _stamp(),
        f"verifiers=={VERIFIERS_VERSION}",
    )
    return VF_VENV / "bin" / "vf-eval"


def ensure_vf_envs() -> Path:
    """``.bench/vf-envs``: vf_arithmetic without dependencies, for the project venv's
    ``vfops eval`` (whose own ``verifiers`` it uses); cached by the same stamp."""
    return ensure_target(
        Path(sys.executable), VF_ENVS, [[str(VF_ENV_DIR)]], _stamp(), "vf_arithmetic"
    )


def _vfops_source() -> str:
    """Where the ``vfops`` the CLI runs comes from, and its git commit (what was measured)."""
    # cwd /: not this checkout, which `python -c` would put first on sys.path.
    done = subprocess.run(
        [str(VFOPS_BIN.parent / "python"), "-c", "import vfops; print(vfops.__file__)"],
        capture_output=True, text=True, env=_client_env(BENCH_DIR, "vfops"), cwd="/",
    )  # fmt: skip
    if done.returncode != 0:
        return "?"
    package = Path(done.stdout.strip()).parent.parent
    git = ["git", "-C", str(package)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return str(package)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "vfops"], capture_output=True)
    return f"{package} @ {head.stdout.strip()}{' (modified)' if dirty.stdout.strip() else ''}"


# ---------------------------------------------------------------- measuring


@dataclass
class RunResult:
    tool: str
    label: str
    planned: int
    argv: list[str]
    wall_s: float = 0.0
    """Process start to exit of the client (the process we started)."""
    tree_wall_s: float = 0.0
    """Start to the exit of the tree's last process: wall_s unless one outlived the client."""
    survivors: list[str] = field(default_factory=list)
    """Processes of the tree alive when the client exited (pid and command line). vfops:
    none may (a run fails with one); vf-eval's env-server worker outlives it by ~1 s."""
    cpu_s: float = 0.0
    returncode: int = 0
    rollouts: int = 0
    errors: int = 0
    reward_mean: float = float("nan")
    off_rewards: int = 0
    """Rollouts without an error whose reward is not BAR_REWARD (the stub makes every one 1.2)."""
    env_name: str | None = None
    """The environment the run's metadata.json names (vfops: ``env_name``; vf-eval: ``env_id``)."""
    env_library: str | None = None
    """vfops: ``env_library`` in metadata.json (``verifiers==0.3.1`` through the adapter)."""
    phase_wall_s: float | None = None
    peak_rss_mb: float = 0.0
    """The client process's own peak RSS (kernel high-water mark VmHWM, last sample)."""
    peak_rss_by_phase_mb: dict[str, float] = field(default_factory=dict)
    tree_peak_rss_mb: float = 0.0
    """Largest sum of the RSS of every process in the tree, sampled together."""
    tree_peak_parts_mb: dict[str, float] = field(default_factory=dict)
    """Each process's RSS in the sample that gave ``tree_peak_rss_mb``: what the bar adds."""
    tree_peak_pss_mb: float = 0.0
    """Largest sum of their PSS (``/proc/PID/smaps_rollup``), sampled together: a page
    shared by N processes counted 1/N in each, so pages a forked child still shares with
    its parent (copy-on-write) count once, where the RSS sum counts them in each."""
    peak_pss_by_process_mb: dict[str, float] = field(default_factory=dict)
    """Each process's largest sampled PSS, by the names of ``peak_rss_by_process_mb``."""
    peak_rss_by_process_mb: dict[str, float] = field(default_factory=dict)
    """Each process's own peak RSS (VmHWM, last sample), by a short name of its command."""
    largest_process_maxrss_mb: float = 0.0
    """``wait4`` ru_maxrss: the peak of the largest single process (client or a child it reaped)."""
    max_tree_processes: int = 0
    samples: int = 0
    last_rollout_to_exit_s: float | None = None
    """Exit time - mtime of results.jsonl (appended once per group, so: the last rollout)."""
    last_rollout_to_metadata_s: float | None = None
    """mtime of metadata.json (rewritten last, once the run is recorded) - the last rollout."""
    recorded: bool | None = None
    """vfops: whether the run was recorded at exit (registry and MLflow, checked right
    after the exit); None: not checked (vf-eval)."""
    recorded_detail: dict[str, Any] = field(default_factory=dict)
    """What the recorded-at-exit check found, and its ``problems``."""
    log: str = ""

    @property
    def completed(self) -> bool:
        return self.returncode == 0 and self.rollouts == self.planned

    @property
    def ok(self) -> bool:
        """Completed, and (vfops) recorded at exit with no process outliving it."""
        if self.tool not in VFOPS_TOOLS:
            return self.completed
        return self.completed and self.recorded is True and not self.survivors

    def problems(self) -> list[str]:
        """What is wrong with the run beyond its completion: a reward other than the
        stub's 1.2, (vfops-vf) not the verifiers package through the adapter, (vfops)
        not recorded at exit or a process outliving the client."""
        out = []
        if self.tool in VFOPS_TOOLS:
            if self.survivors:
                out.append(
                    f"BUG: {len(self.survivors)} process(es) of its tree outlived it (the run "
                    f"fails): {'; '.join(self.survivors)}"
                )
            if self.recorded is False:
                reasons = "; ".join(self.recorded_detail.get("problems") or ["?"])
                out.append(f"not recorded at exit: {reasons}")
        if self.off_rewards:
            out.append(f"{self.off_rewards} rollouts scored other than {BAR_REWARD:g}")
        expected = "arithmetic" if self.tool == "vfops" else "vf_arithmetic"
        if self.rollouts and self.env_name != expected:
            out.append(f"metadata.json names env {self.env_name!r}, not {expected!r}")
        adapted = str(self.env_library or "").startswith("verifiers==")
        if self.tool == "vfops-vf" and self.rollouts and not adapted:
            out.append(f"env_library is {self.env_library!r}: not run through the adapter")
        return out

    @property
    def rate(self) -> float:
        return self.rollouts / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def phase_rate(self) -> float | None:
        return self.rollouts / self.phase_wall_s if self.phase_wall_s else None

    @property
    def cpu_ms_per_rollout(self) -> float:
        return self.cpu_s / self.rollouts * 1000.0 if self.rollouts else float("nan")

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("log", "argv")}
        data["argv"] = shlex.join(self.argv)
        if self.reward_mean != self.reward_mean:  # NaN (no rewards) is not JSON
            data["reward_mean"] = None
        data.update(
            completed=self.completed,
            ok=self.ok,
            problems=self.problems(),
            rollouts_per_s=self.rate,
            phase_rollouts_per_s=self.phase_rate,
            cpu_ms_per_rollout=self.cpu_ms_per_rollout if self.rollouts else None,
        )
        return data


def _children_of(pid: int) -> list[int]:
    if not _PROC_CHILDREN:
        try:
            return [p.pid for p in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:  # a child belongs to the thread that forked it
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def _proc_pss_mb(pid: int) -> float | None:
    """The process's proportional set size (MB), or None (gone, or no smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _proc_stats(pid: int) -> tuple[float, float, float] | None:
    """(CPU s, RSS MB, peak RSS MB) of one process from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except (OSError, IndexError):
        return None
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    memory: dict[str, float] = {}
    for line in status.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            memory[key] = int(value.split()[0]) / 1024.0
    if "VmRSS" not in memory:  # a zombie has no memory left
        return None
    return cpu, memory["VmRSS"], memory.get("VmHWM", memory["VmRSS"])


class _TreeSampler(threading.Thread):
    """Samples a process tree every SAMPLE_INTERVAL_S: CPU per pid, the root's RSS and
    high-water mark, the tree's total RSS, and (vfops) when results.jsonl got its first data."""

    def __init__(self, pid: int, results_glob: tuple[Path, str] | None) -> None:
        super().__init__(daemon=True)
        self.root = pid
        self.cpu_by_pid: dict[int, float] = {}
        self.seen: dict[int, float] = {}  # pid -> create time, to find survivors
        self.names: dict[int, str] = {}
        self.peak_by_pid: dict[int, float] = {}
        self.peak_rss = 0.0
        self.root_rss: list[tuple[float, float]] = []  # (epoch, RSS MB)
        self.first_results_epoch: float | None = None
        self.tree_peak = 0.0
        self.tree_peak_parts: dict[int, float] = {}  # pid -> RSS MB in the peak's sample
        self.tree_peak_pss = 0.0
        self.pss_peak_by_pid: dict[int, float] = {}
        self.max_procs = 0
        self.samples = 0
        self._results_glob = results_glob
        self._results: Path | None = None
        self._stop_event = threading.Event()

    def _watch_results(self) -> None:
        if self._results_glob is None or self.first_results_epoch is not None:
            return
        if self._results is None:
            base, pattern = self._results_glob
            self._results = next(iter(base.glob(pattern)), None)
        try:
            if self._results is not None and self._results.stat().st_size > 0:
                self.first_results_epoch = time.time()
        except OSError:
            return

    def _tree(self) -> list[int]:
        pids, i = [self.root], 0
        while i < len(pids):
            pids.extend(_children_of(pids[i]))
            i += 1
        return pids

    def sample(self) -> None:
        self._watch_results()
        now = time.time()
        tree_rss, tree_pss, procs = 0.0, 0.0, 0
        parts: dict[int, float] = {}
        for pid in self._tree():
            stats = _proc_stats(pid)
            if stats is None:
                continue
            cpu, rss, hwm = stats
            procs += 1
            tree_rss += rss
            parts[pid] = rss
            pss = _proc_pss_mb(pid)
            if pss is not None:
                tree_pss += pss
                self.pss_peak_by_pid[pid] = max(self.pss_peak_by_pid.get(pid, 0.0), pss)
            self.cpu_by_pid[pid] = cpu
            self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0.0), hwm, rss)
            if pid not in self.seen:
                with contextlib.suppress(psutil.Error):
                    self.seen[pid] = psutil.Process(pid).create_time()
            # every time: a child seen between its fork and its exec has its parent's argv
            self.names[pid] = _process_name(pid)
            if pid == self.root:
                self.peak_rss = max(self.peak_rss, hwm, rss)
                self.root_rss.append((now, rss))
        if procs:
            self.samples += 1
            if tree_rss > self.tree_peak:
                self.tree_peak, self.tree_peak_parts = tree_rss, parts
            self.tree_peak_pss = max(self.tree_peak_pss, tree_pss)
            self.max_procs = max(self.max_procs, procs)

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def peaks_by_process(self, pss: bool = False) -> dict[str, float]:
        """Each process's peak RSS (``pss``: sampled PSS) by name (``name#2`` for a second
        one of that name)."""
        return self.by_name(self.pss_peak_by_pid if pss else self.peak_by_pid)

    def by_name(self, by_pid: dict[int, float]) -> dict[str, float]:
        """``by_pid`` keyed by process name (``name#2`` for a second one of that name)."""
        out: dict[str, float] = {}
        for pid, peak in by_pid.items():
            name = self.names.get(pid) or str(pid)
            key, i = name, 1
            while key in out:
                i += 1
                key = f"{name}#{i}"
            out[key] = peak
        return out

    def alive_seen(self) -> list[int]:
        """Processes seen in the tree (the root aside) that are still running."""
        alive = []
        for pid, created in self.seen.items():
            if pid == self.root:
                continue
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
        return alive


def _process_name(pid: int) -> str:
    """A short name for a process of a client's tree: ``vfops``, ``_tracker_main``, ..."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return str(pid)
    if not argv:
        return str(pid)
    first = Path(argv[0]).name
    if not first.startswith("python"):
        return first
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        rest = rest[2:] if rest[0] in ("-X", "-W") else rest[1:]  # interpreter options
    if rest[:1] == ["-m"] and len(rest) > 1:  # python -m vfops.tracking._tracker_main
        return rest[1].rsplit(".", 1)[-1]
    if rest[:1] == ["-c"]:
        return "python -c"
    return Path(rest[0]).name if rest else first  # a script: .venv/bin/vfops


def _become_subreaper() -> bool:
    """Linux: make the bench the reaper of its clients' orphans (PR_SET_CHILD_SUBREAPER),
    so that a process which outlives its client, however short-lived or deep in the
    tree, becomes the bench's child and is found (and reaped) after the client exits."""
    if sys.platform != "linux":
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER


def _own_children() -> set[int]:
    with contextlib.suppress(psutil.Error):
        return {p.pid for p in psutil.Process().children()}
    return set()


def _describe(pid: int) -> str:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline())[:120] or proc.name()
        return f"pid {pid} ({cmd})"
    return f"pid {pid}"


def _outlivers(before: set[int], sampler: _TreeSampler) -> list[int]:
    """The processes of the client's tree still running once the client has exited:
    orphans now the bench's (subreaper) and, as well, those the sampler saw. Orphans
    already gone (zombies: exited before or just after the client) are reaped."""
    found = set(sampler.alive_seen())
    for pid in _own_children() - before:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                continue
            found.add(pid)
    return sorted(found)


def _wait_out(pids: list[int], timeout_s: float) -> None:
    """Wait for the processes that outlived a client (the next run must not overlap
    them); end the ones still running after ``timeout_s``, each by its pid."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        print(f"  !! ending {_describe(proc.pid)}: still running {timeout_s:g} s after its client")
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(alive, timeout=10.0)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=10.0)


def _client_env(vfops_home: Path, tool: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env.update(
        {
            API_KEY_VAR: "dummy",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "VFOPS_HOME": str(vfops_home),
        }
    )
    if tool == "vfops-vf":  # vf_arithmetic visible to this process only
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VF_ENVS), env.get("PYTHONPATH")]))
    elif tool not in VFOPS_TOOLS:
        env.pop("PYTHONPATH", None)  # keep the verifiers venv clean of a vfops checkout
    return env


def run_client(
    tool: str,
    label: str,
    argv: list[str],
    *,
    out_dir: Path,
    vfops_home: Path,
    planned: int,
) -> RunResult:
    """Run one client subprocess to completion and measure it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results_glob = RESULTS_GLOB[tool]
    log_path = out_dir / "client.log"
    result = RunResult(tool=tool, label=label, planned=planned, argv=argv)
    before = _own_children()  # the stub server's process, ...
    with log_path.open("w") as log:
        wall0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=out_dir, env=_client_env(vfops_home, tool), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        sampler = _TreeSampler(proc.pid, (out_dir, results_glob) if tool in VFOPS_TOOLS else None)
        sampler.start()
        # wait4, not wait: its rusage is the client's with every child it reaped
        # (CPU, and ru_maxrss = the peak of the largest of those processes).
        _, status, usage = os.wait4(proc.pid, 0)
        exit_epoch = time.time()
        result.wall_s = time.perf_counter() - wall0
        proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop()
        outlivers = _outlivers(before, sampler)
        result.survivors = [_describe(pid) for pid in outlivers]
        if outlivers:  # the next run must not overlap them
            _wait_out(outlivers, SURVIVOR_WAIT_S)
        result.tree_wall_s = time.perf_counter() - wall0 if outlivers else result.wall_s
    # A descendant its parent never reaped is missing from the rusage; the samples
    # (a lower bound: up to one interval late per process) cover it.
    result.cpu_s = max(usage.ru_utime + usage.ru_stime, sum(sampler.cpu_by_pid.values()))
    result.returncode = proc.returncode
    result.largest_process_maxrss_mb = usage.ru_maxrss / 1024.0  # KiB on Linux
    result.peak_rss_mb = sampler.peak_rss
    result.tree_peak_rss_mb = sampler.tree_peak
    result.tree_peak_parts_mb = sampler.by_name(sampler.tree_peak_parts)
    result.tree_peak_pss_mb = sampler.tree_peak_pss
    result.peak_rss_by_process_mb = sampler.peaks_by_process()
    result.peak_pss_by_process_mb = sampler.peaks_by_process(pss=True)
    result.max_tree_processes = sampler.max_procs
    result.samples = sampler.samples
    result.log = log_path.read_text(errors="replace")[-3000:]
    last_rollout = _read_results(result, out_dir, results_glob, exit_epoch)
    result.peak_rss_by_phase_mb = _peaks_by_phase(
        sampler.root_rss, sampler.first_results_epoch, last_rollout
    )
    if not result.completed:
        print(f"  !! {tool} {label} exited {result.returncode} with "
              f"{result.rollouts}/{planned} rollouts; log tail:")  # fmt: skip
        print("     " + result.log[-1500:].replace("\n", "\n     "))
    return result


def _peaks_by_phase(
    samples: list[tuple[float, float]], first_results: float | None, last_rollout: float | None
) -> dict[str, float]:
    """The root's sampled RSS peak before its first results, up to its last rollout, after it."""
    if first_results is None or last_rollout is None:
        return {}
    peaks: dict[str, float] = {}
    for t, rss in samples:
        phase = "start-up" if t < first_results else "rollouts" if t <= last_rollout else "finish"
        peaks[phase] = max(peaks.get(phase, 0.0), rss)
    return peaks


def _read_results(
    result: RunResult, out_dir: Path, pattern: str, exit_epoch: float
) -> float | None:
    """Count the rollouts and read the run's metadata; returns the last rollout's time (vfops)."""
    results_file = next(iter(out_dir.glob(pattern)), None)
    if results_file is None:
        return None
    rewards: list[float] = []
    with results_file.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("error"):
                result.errors += 1
                continue
            result.rollouts += 1
            if row.get("reward") is not None:
                rewards.append(float(row["reward"]))
            if row.get("reward") is None or abs(float(row["reward"]) - BAR_REWARD) > 1e-9:
                result.off_rewards += 1
    if rewards:
        result.reward_mean = sum(rewards) / len(rewards)
    meta_path = results_file.parent / "metadata.json"
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_bytes())
    if result.tool not in VFOPS_TOOLS:
        result.env_name = meta.get("env_id") or meta.get("env")
        result.phase_wall_s = meta.get("time")
        return None
    result.env_name = meta.get("env_name")
    result.env_library = meta.get("env_library")
    result.phase_wall_s = (meta.get("summary") or {}).get("wall_s")
    last_rollout = results_file.stat().st_mtime
    result.last_rollout_to_exit_s = exit_epoch - last_rollout
    result.last_rollout_to_metadata_s = meta_path.stat().st_mtime - last_rollout
    return last_rollout


_RECORDED_CHECK = r"""
import json, math, sys
import sqlite3
from pathlib import Path

args = json.loads(sys.argv[1])
found = {"problems": []}
problems = found["problems"]


def done():
    print(json.dumps(found))
    sys.exit(0)


db = Path(args["home"]) / "registry.db"
try:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    row = con.execute(
        "SELECT id, status, mlflow_run_id, output_dir FROM eval_runs"
        " ORDER BY started_at DESC LIMIT 1"
    ).fetchone()
    con.close()
except sqlite3.Error as exc:
    problems.append(f"registry {db}: {exc}")
    done()
if row is None:
    problems.append("no eval_runs row in the registry")
    done()
run_id, status, mlflow_id, output_dir = row
found.update(registry_run=run_id, registry_status=status, mlflow_run_id=mlflow_id)
if not str(output_dir or "").startswith(args["out_dir"]):
    problems.append(f"the newest eval_runs row ({run_id}) is another run's: {output_dir}")
if status != "completed":
    problems.append(f"registry status {status!r}, not 'completed'")
if not args["tracking"]:
    done()
if not mlflow_id:
    problems.append("no mlflow_run_id in the registry run")
    done()
from vfops.tracking import mlflow_client

client = mlflow_client()
try:
    run = client.get_run(mlflow_id)
except Exception as exc:
    problems.append(f"MLflow run {mlflow_id}: {type(exc).__name__}: {exc}")
    done()
metrics = run.data.metrics
found.update(
    mlflow_status=run.info.status,
    rollouts=metrics.get("rollouts"),
    reward_mean=metrics.get("reward_mean"),
)
if run.info.status != "FINISHED":
    problems.append(f"MLflow run status {run.info.status}, not FINISHED")
if metrics.get("rollouts") != args["rollouts"]:
    problems.append(f"metric rollouts {metrics.get('rollouts')}, not {args['rollouts']}")
reward = metrics.get("reward_mean")
if reward is None or not math.isfinite(reward):
    problems.append(f"metric reward_mean {reward}")
artifacts = [a.path for a in client.list_artifacts(mlflow_id)]
found["artifacts"] = artifacts
if args["artifact"] not in artifacts:
    problems.append(f"no {args['artifact']} artifact (artifacts: {artifacts})")
traces, token = 0, None
while True:
    page = client.search_traces(
        locations=[run.info.experiment_id], run_id=mlflow_id, include_spans=False,
        max_results=500, page_token=token,
    )
    traces += len(page)
    token = page.token
    if not token:
        break
found["traces"] = traces
if traces != args["traces"]:
    problems.append(f"{traces} traces, not {args['traces']}")
done()
"""
"""Run as ``python -c`` right after a vfops run exits (the bench itself never imports
MLflow): prints what the registry and MLflow hold for the run, and its problems."""


def check_recorded(result: RunResult, out_dir: Path, vfops_home: Path, *, tracking: bool) -> None:
    """Whether ``result``'s run was recorded at exit: registry run completed with its
    MLflow run id and (``tracking``) that MLflow run finished with everything in it."""
    expected = {
        "home": str(vfops_home),
        "out_dir": str(out_dir),
        "tracking": tracking,
        "rollouts": float(result.planned),
        "traces": min(result.planned, TRACES_PER_RUN),
        "artifact": RECORDED_ARTIFACT,
    }
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RECORDED_CHECK, json.dumps(expected)],
            capture_output=True, text=True, env=_client_env(vfops_home, "vfops"), cwd="/",
            timeout=RECORDED_CHECK_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        detail: dict[str, Any] = {"problems": [f"the check ran past {RECORDED_CHECK_TIMEOUT_S} s"]}
    else:
        lines = done.stdout.strip().splitlines()
        try:
            detail = json.loads(lines[-1]) if lines else {}
        except ValueError:
            detail = {}
        if done.returncode != 0 or "problems" not in detail:
            tail = (done.stderr or done.stdout).strip()[-600:]
            detail = {"problems": [f"the check failed (exit {done.returncode}): {tail}"]}
    detail["tracking"] = tracking
    detail["check_s"] = round(time.perf_counter() - t0, 2)
    result.recorded_detail = detail
    result.recorded = not detail["problems"]


def _recorded_line(res: RunResult) -> str:
    d = res.recorded_detail
    if res.recorded is None:
        return ""
    if not res.recorded:
        return "    recorded at exit: NO — " + "; ".join(d.get("problems") or ["?"])
    what = f"registry {d.get('registry_status')}"
    if d.get("tracking"):
        what += (
            f", MLflow {d.get('mlflow_status')} (rollouts {d.get('rollouts'):g}, reward_mean "
            f"{d.get('reward_mean'):.3f}, {d.get('traces')} traces, {RECORDED_ARTIFACT})"
        )
    else:
        what += " (--no-tracking: no MLflow run)"
    return f"    recorded at exit: yes — {what}; checked in {d.get('check_s')} s, not timed"


RESULTS_GLOB = {
    "vfops": "outputs/evals/arithmetic--*/*/results.jsonl",
    "vfops-vf": "outputs/evals/vf_arithmetic--*/*/results.jsonl",
    "vf-eval": "outputs/evals/vf_arithmetic--*/*/results.jsonl",
}


@dataclass(frozen=True)
class Workload:
    n: int
    r: int
    c: int
    latency_ms: float
    env_args: dict[str, Any] | None = None

    @property
    def rollouts(self) -> int:
        return self.n * self.r

    def describe(self) -> str:
        args = f" -a '{json.dumps(self.env_args)}'" if self.env_args else ""
        return (
            f"{self.rollouts:,} rollouts (-n {self.n} -r {self.r}{args}), -c {self.c}, "
            f"max_tokens {MAX_TOKENS}, stub latency {self.latency_ms:g} ms"
        )


class Bench:
    """The shared state of one bench invocation: work folder, stores, tools."""

    def __init__(self, work: Path, vf_eval: Path | None) -> None:
        self.work = work
        self.vf_eval = vf_eval
        # One VFOPS_HOME for every vfops run, as a user has: the registry and the
        # MLflow store are created once, by an unmeasured warm-up run.
        self.vfops_home = work / "vfops-home"
        self.stores_ready = False
        self._runs = 0

    def argv(self, tool: str, base_url: str, w: Workload, out: Path, extra: list[str]) -> list[str]:
        common = [
            "-m", MODEL, "-b", base_url, "-k", API_KEY_VAR, "-n", str(w.n), "-r", str(w.r),
            "-c", str(w.c), "-t", str(MAX_TOKENS), "-o", str(out / "outputs"),
        ]  # fmt: skip
        if w.env_args:
            common += ["-a", json.dumps(w.env_args)]
        if tool in VFOPS_TOOLS:
            # No --quiet: the live display is off anyway (stderr is a log file, not a TTY).
            env = "arithmetic" if tool == "vfops" else "vf_arithmetic"
            return [str(VFOPS_BIN), "eval", env, *common, *extra]
        assert self.vf_eval is not None
        # -s: save results.jsonl (what we count); -d: plain logging instead of the
        # Rich live display (the cheaper of the two).
        return [str(self.vf_eval), "vf_arithmetic", *common, "-s", "-d", *extra]

    def run(
        self, tool: str, label: str, base_url: str, w: Workload, extra: list[str] | None = None
    ) -> RunResult:
        if tool in VFOPS_TOOLS and not self.stores_ready:
            self._warm_stores(base_url)
        self._runs += 1
        out_dir = self.work / f"{self._runs:03d}-{tool}-{label}"
        argv = self.argv(tool, base_url, w, out_dir, extra or [])
        result = run_client(
            tool, label, argv, out_dir=out_dir, vfops_home=self.vfops_home, planned=w.rollouts
        )
        if tool in VFOPS_TOOLS:  # before the next run starts, outside the timed part
            tracking = "--no-tracking" not in (extra or [])
            check_recorded(result, out_dir, self.vfops_home, tracking=tracking)
        for problem in result.problems():
            print(f"  !! {tool} {label}: {problem}")
        return result

    def _warm_stores(self, base_url: str) -> None:
        self.stores_ready = True
        res = self.run("vfops", "store-warm-up", base_url, Workload(1, 1, 1, 0.0))
        print(
            f"  store warm-up (creates the registry and MLflow store in VFOPS_HOME, not "
            f"counted): {res.wall_s:.2f} s\n{_recorded_line(res)}",
            flush=True,
        )
        if not res.ok:
            raise SystemExit("the vfops warm-up run failed; see the log above")

    def describe_argv(self, argv: list[str], tool: str = "") -> str:
        text = shlex.join(argv).replace(str(self.work), "$WORK")
        if tool == "vfops-vf":
            text = f"PYTHONPATH={VF_ENVS.relative_to(ROOT)} {text}"
        if self.vf_eval is not None:
            text = text.replace(str(self.vf_eval), "vf-eval")
        return text.replace(str(VFOPS_BIN), "vfops")


def _fmt(value: float | None, spec: str) -> str:
    """``format(value, spec)``; a missing value is "-", right-aligned to the spec's width."""
    if value is not None:
        return format(value, spec)
    width = spec.split(".")[0]
    return "-".rjust(int(width) if width.isdigit() else 1)


def _run_line(res: RunResult) -> str:
    """One line per run; vfops: and its recorded-at-exit verdict below it."""
    # vfops: a survivor is a bug (and a problem of the run); vf-eval's worker outlives it
    after = (
        f" (its worker outlived it: last process gone at {res.tree_wall_s:.2f} s)"
        if res.survivors and res.tool not in VFOPS_TOOLS
        else ""
    )
    line = (
        f"  {res.tool:<8} {res.label:<16} {res.rollouts:>7}/{res.planned} rollouts  "
        f"wall {res.wall_s:7.2f} s  phase {_fmt(res.phase_wall_s, '7.2f')} s  "
        f"CPU {res.cpu_s:7.2f} s  reward {res.reward_mean:.3f}"
        f"{f' env {res.env_name}' if res.tool == 'vfops-vf' else ''}{after}"
    )
    recorded = _recorded_line(res)
    return f"{line}\n{recorded}" if recorded else line


# ---------------------------------------------------------------- the parts


def _stub(latency_ms: float) -> StubServer:
    return StubServer(StubConfig(latency_ms=latency_ms, reply_mode="arithmetic"), subprocess=True)


def part_throughput(
    bench: Bench,
    tools: list[str],
    w: Workload,
    *,
    latencies: list[float],
    part: str = "throughput",
) -> dict[str, Any]:
    """Bar 1: full run and -n 1 -r 1 start-up run of each tool at each latency."""
    rows: list[dict[str, Any]] = []
    for latency in latencies:
        wl = Workload(w.n, w.r, w.c, latency)
        with _stub(latency) as stub:
            print(f"[{part}] stub latency {latency:g} ms at {stub.base_url}", flush=True)
            for tool in tools:
                start = bench.run(tool, "start-up", stub.base_url, Workload(1, 1, w.c, latency))
                print(_run_line(start), flush=True)
                full = bench.run(tool, "full", stub.base_url, wl)
                print(_run_line(full), flush=True)
                rows.append(_throughput_row(tool, wl, start, full, bench))
            print(f"  stub served {stub.stats['ok']} ok / {stub.stats['requests']} requests")
    workload = {k: v for k, v in w.__dict__.items() if k != "latency_ms"}
    return {"part": part, "workload": workload | {"latencies_ms": latencies}, "rows": rows}


def _throughput_row(
    tool: str, w: Workload, start: RunResult, full: RunResult, bench: Bench
) -> dict[str, Any]:
    bound = w.c / (w.latency_ms / 1000.0) if w.latency_ms > 0 else None
    marginal = (
        (full.cpu_s - start.cpu_s) / (full.rollouts - 1) * 1000.0 if full.rollouts > 1 else None
    )
    return {
        "tool": tool,
        "latency_ms": w.latency_ms,
        "settings": w.describe(),
        "command": bench.describe_argv(full.argv, tool),
        "bound_per_s": bound,
        "e2e_fraction_of_bound": full.rate / bound if bound else None,
        "phase_fraction_of_bound": (full.phase_rate or 0.0) / bound if bound else None,
        "marginal_cpu_ms_per_rollout": marginal,
        "full": full.to_json(),
        "startup": start.to_json(),
    }


def part_short(bench: Bench, tools: list[str], w: Workload, *, repeats: int) -> dict[str, Any]:
    """Bar 2: a warm-up and ``repeats`` runs of each variant, interleaved (so load drifts
    hit every variant alike)."""
    variants: list[tuple[str, str, list[str]]] = [("vfops", "defaults", [])]
    variants.append(("vfops", "no-tracking", ["--no-tracking"]))
    if "vf-eval" in tools:
        variants.append(("vf-eval", "vf-eval", []))
    runs: dict[str, list[RunResult]] = {label: [] for _, label, _ in variants}
    warm: dict[str, RunResult] = {}
    with _stub(w.latency_ms) as stub:
        print(f"[short] stub latency {w.latency_ms:g} ms at {stub.base_url}", flush=True)
        for tool, label, extra in variants:
            warm[label] = bench.run(tool, f"{label}-warm", stub.base_url, w, extra)
            print(_run_line(warm[label]), flush=True)
        for i in range(repeats):
            for tool, label, extra in variants:
                res = bench.run(tool, f"{label}-{i + 1}", stub.base_url, w, extra)
                print(_run_line(res), flush=True)
                runs[label].append(res)
    out: dict[str, Any] = {"workload": w.__dict__, "repeats": repeats, "variants": []}
    for tool, label, _ in variants:
        walls = [r.wall_s for r in runs[label]]
        out["variants"].append(
            {
                "variant": label,
                "tool": tool,
                "command": bench.describe_argv(runs[label][0].argv) if runs[label] else "",
                "median_wall_s": statistics.median(walls) if walls else None,
                "min_wall_s": min(walls, default=None),
                "max_wall_s": max(walls, default=None),
                "median_cpu_s": statistics.median(r.cpu_s for r in runs[label]) if walls else None,
                "median_phase_s": _median_opt([r.phase_wall_s for r in runs[label]]),
                "median_tail_s": _median_opt([r.last_rollout_to_exit_s for r in runs[label]]),
                "warm_up_wall_s": warm[label].wall_s,
                "all_ok": all(r.ok for r in runs[label]) and warm[label].ok,
                "recorded": sum(bool(r.recorded) for r in [warm[label], *runs[label]]),
                "runs": len(runs[label]) + 1,
                "walls_s": walls,
            }
        )
    return out


def _median_opt(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def part_memory(bench: Bench, w: Workload) -> dict[str, Any]:
    """Bar 3: one big vfops run; peak RSS (process and tree) and the last-rollout-to-exit tail."""
    with _stub(w.latency_ms) as stub:
        print(f"[memory] stub latency {w.latency_ms:g} ms at {stub.base_url}", flush=True)
        res = bench.run("vfops", "memory", stub.base_url, w)
        print(_run_line(res), flush=True)
        print(f"  stub served {stub.stats['ok']} ok / {stub.stats['requests']} requests")
    return {
        "workload": w.__dict__,
        "settings": w.describe(),
        "command": bench.describe_argv(res.argv),
        "run": res.to_json(),
    }


# ---------------------------------------------------------------- report


@dataclass
class Bar:
    name: str
    what: str
    measured: str
    target: str
    ok: bool | None
    """None: not measured (a part was skipped or failed to produce the figure)."""
    bar_workload: bool
    """False when the sizes differ from the bar's (--quick, -n ...): indicative only."""

    def verdict(self) -> str:
        if self.ok is None:
            return "n/a"
        return ("PASS" if self.ok else "FAIL") + ("" if self.bar_workload else "*")


def print_throughput(data: dict[str, Any]) -> list[Bar]:
    rows = data["rows"]
    w = data["workload"]
    part = data.get("part", "throughput")
    print()
    latencies = ", ".join(f"{x:g}" for x in w["latencies_ms"])
    title = "[1] throughput" if part == "throughput" else "[1d] verifiers adapter (throughput rows)"
    print(
        f"{title}: {w['n'] * w['r']:,} rollouts (-n {w['n']} -r {w['r']}), -c {w['c']}, "
        f"max_tokens {MAX_TOKENS}, stub latency {latencies} ms"
    )
    for row in rows:
        print(f"    {row['tool']:<8} @ {row['latency_ms']:g} ms: {row['command']}")
    header = (
        f"  {'tool':<8} {'latency':>7} {'done':>6} {'wall s':>7} {'e2e/s':>7} {'phase s':>7} "
        f"{'phase/s':>7} {'e2e %':>6} {'phase %':>7} {'CPU ms/r':>8} {'marg ms/r':>9} "
        f"{'tail s':>6} {'start s':>7} {'start CPU':>9} {'peak MB':>7} {'tree MB':>7} {'rec':>3}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for row in rows:
        full, start = row["full"], row["startup"]
        e2e_pct = _fmt(_pct(row["e2e_fraction_of_bound"]), ".1f")
        phase_pct = _fmt(_pct(row["phase_fraction_of_bound"]), ".1f")
        print(
            f"  {row['tool']:<8} {row['latency_ms']:>5g}ms {full['rollouts']:>6} "
            f"{full['wall_s']:>7.2f} {full['rollouts_per_s']:>7.1f} "
            f"{_fmt(full['phase_wall_s'], '7.2f')} {_fmt(full['phase_rollouts_per_s'], '7.1f')} "
            f"{e2e_pct:>6} {phase_pct:>7} {_fmt(full['cpu_ms_per_rollout'], '8.3f')} "
            f"{_fmt(row['marginal_cpu_ms_per_rollout'], '9.3f')} "
            f"{_fmt(full['last_rollout_to_exit_s'], '6.2f')} {start['wall_s']:>7.2f} "
            f"{start['cpu_s']:>9.2f} {full['peak_rss_mb']:>7.0f} {full['tree_peak_rss_mb']:>7.0f} "
            f"{_recorded_mark(full, start):>3}"
        )
    print(
        "  e2e/s: rollouts / process wall time (start to exit: imports, env load, rollouts,\n"
        "  registry + MLflow run finished, result files); phase/s: rollouts / rollout-phase\n"
        "  wall time (vfops: summary.wall_s in metadata.json; vf-eval: `time` in its\n"
        "  metadata.json); e2e % / phase %: of the bound C / latency; CPU ms/r: CPU of the\n"
        "  client's process tree (vfops: + its registry and tracker children) / rollouts;\n"
        "  marg ms/r: (CPU - start-up run CPU) / (rollouts - 1); tail s: last rollout\n"
        "  (mtime of results.jsonl) to process exit; start s / start CPU: wall and CPU s of\n"
        "  a -n 1 -r 1 run; peak MB: the client process' peak RSS (VmHWM); tree MB: the\n"
        "  largest sampled sum of the tree's RSS; rec: vfops, both runs recorded at exit\n"
        "  (registry completed + linked, MLflow run FINISHED with its metrics, artifact and\n"
        "  traces) with no process outliving vfops."
    )
    if any(row["tool"] == "vfops-vf" for row in rows):
        print(
            "  vfops-vf: `vfops eval vf_arithmetic`, the verifiers package vf-eval runs, through\n"
            "  vfops' verifiers adapter (PYTHONPATH=.bench/vf-envs, the project venv's verifiers)."
        )
    by = {(r["tool"], r["latency_ms"]): r for r in rows}
    for latency in w["latencies_ms"]:
        for tool, other in (("vfops", "vf-eval"), ("vfops-vf", "vf-eval"), ("vfops-vf", "vfops")):
            a, b = by.get((tool, latency)), by.get((other, latency))
            if not (a and b and a["full"]["rollouts"] and b["full"]["rollouts"]):
                continue
            pa, pb = a["full"]["phase_rollouts_per_s"], b["full"]["phase_rollouts_per_s"]
            print(
                f"  ratio {tool}/{other} @ {latency:g} ms: rollouts/s "
                f"x{a['full']['rollouts_per_s'] / b['full']['rollouts_per_s']:.2f} end-to-end, "
                f"x{_fmt(pa / pb if pa and pb else None, '.2f')} rollout phase; {other} uses "
                f"x{b['full']['cpu_ms_per_rollout'] / a['full']['cpu_ms_per_rollout']:.2f} "
                "the CPU per rollout"
            )
    for row in rows:
        if row["tool"] == "vfops-vf":
            full = row["full"]
            problems = "; ".join(full["problems"] + row["startup"]["problems"]) or "none"
            print(
                f"  vfops-vf @ {row['latency_ms']:g} ms: env {full['env_name']!r} "
                f"({full['env_library']}), reward mean {_fmt(full['reward_mean'], '.3f')}, "
                f"problems: {problems}"
            )
    bars = _throughput_bars(by, w) if part == "throughput" else []
    return [*bars, _adapter_bar(by, w)]


def _recorded_mark(*runs: dict[str, Any]) -> str:
    """``yes`` when every (vfops) run was recorded at exit with no survivor, ``-`` for vf-eval."""
    if any(r["recorded"] is None for r in runs):
        return "-"
    return "yes" if all(r["recorded"] and not r["survivors"] for r in runs) else "NO"


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else fraction * 100.0


def _throughput_bars(by: dict[tuple[str, float], dict[str, Any]], w: dict[str, Any]) -> list[Bar]:
    row = by.get(("vfops", BAR_LATENCY_MS))
    exact = {k: w[k] for k in ("n", "r", "c")} == BAR_THROUGHPUT
    bound = BAR_THROUGHPUT["c"] / (BAR_LATENCY_MS / 1000.0)
    target_e2e = f">= {BAR_E2E_FRACTION * bound:.0f}/s ({BAR_E2E_FRACTION:.0%})"
    target_phase = f">= {BAR_PHASE_FRACTION * bound:.0f}/s ({BAR_PHASE_FRACTION:.0%})"
    target_vs = f">= x{BAR_VS_VF_EVAL:g}"
    what = (
        f"{BAR_THROUGHPUT['n'] * BAR_THROUGHPUT['r']:,} rollouts, -c {BAR_THROUGHPUT['c']}, "
        f"{BAR_LATENCY_MS:g} ms"
    )
    if row is None:
        return [
            Bar("1a", f"end-to-end rate, {what}", "-", target_e2e, None, exact),
            Bar("1b", f"rollout-phase rate, {what}", "-", target_phase, None, exact),
            Bar("1c", "end-to-end rate vs vf-eval's", "-", target_vs, None, exact),
        ]
    full = row["full"]
    bound = row["bound_per_s"]
    e2e, phase = full["rollouts_per_s"], full["phase_rollouts_per_s"] or 0.0
    bars = [
        Bar("1a", f"end-to-end rate, {what}",
            f"{e2e:.0f}/s ({e2e / bound:.1%})", target_e2e,
            full["ok"] and e2e >= BAR_E2E_FRACTION * bound, exact),
        Bar("1b", f"rollout-phase rate, {what}",
            f"{phase:.0f}/s ({phase / bound:.1%})", target_phase,
            full["ok"] and phase >= BAR_PHASE_FRACTION * bound, exact),
    ]  # fmt: skip
    other = by.get(("vf-eval", BAR_LATENCY_MS))
    if other is None or not other["full"]["rollouts_per_s"]:
        bars.append(Bar("1c", "end-to-end rate vs vf-eval's", "-", target_vs, None, exact))
    else:
        ratio = e2e / other["full"]["rollouts_per_s"]
        bars.append(
            Bar("1c", "end-to-end rate vs vf-eval's (same workload)",
                f"x{ratio:.2f} ({e2e:.0f} vs {other['full']['rollouts_per_s']:.0f}/s)", target_vs,
                full["ok"] and other["full"]["ok"] and ratio >= BAR_VS_VF_EVAL, exact)
        )  # fmt: skip
    return bars


def _adapter_bar(by: dict[tuple[str, float], dict[str, Any]], w: dict[str, Any]) -> Bar:
    """Bar 1d (issue 15): vfops on the verifiers package vs vf-eval on it, end to end."""
    exact = {k: w[k] for k in ("n", "r", "c")} == BAR_THROUGHPUT
    what = "vfops on a verifiers env end-to-end rate vs vf-eval's"
    target = f">= x{BAR_ADAPTER_VS_VF_EVAL:g}"
    row, other = by.get(("vfops-vf", BAR_LATENCY_MS)), by.get(("vf-eval", BAR_LATENCY_MS))
    if row is None or other is None or not other["full"]["rollouts_per_s"]:
        return Bar("1d", what, "-", target, None, exact)
    a, b = row["full"], other["full"]
    ratio = a["rollouts_per_s"] / b["rollouts_per_s"]
    clean = not (a["problems"] or b["problems"])
    return Bar(
        "1d", f"{what} (same env and workload)",
        f"x{ratio:.2f} ({a['rollouts_per_s']:.0f} vs {b['rollouts_per_s']:.0f}/s)", target,
        a["ok"] and b["ok"] and clean and ratio >= BAR_ADAPTER_VS_VF_EVAL, exact,
    )  # fmt: skip


def print_short(data: dict[str, Any]) -> list[Bar]:
    w = data["workload"]
    print()
    print(
        f"[2] short eval: {w['n'] * w['r']} rollouts (-n {w['n']} -r {w['r']}), -c {w['c']}, "
        f"max_tokens {MAX_TOKENS}, stub latency {w['latency_ms']:g} ms; one warm-up run per "
        f"variant, then {data['repeats']} measured runs of each, interleaved"
    )
    for v in data["variants"]:
        print(f"    {v['variant']:<12} {v['command']}")
    header = (
        f"  {'variant':<12} {'median s':>8} {'min s':>7} {'max s':>7} {'phase s':>7} "
        f"{'tail s':>6} {'CPU s':>6} {'warm-up s':>9} {'ok':>3}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for v in data["variants"]:
        print(
            f"  {v['variant']:<12} {_fmt(v['median_wall_s'], '8.2f')} "
            f"{_fmt(v['min_wall_s'], '7.2f')} {_fmt(v['max_wall_s'], '7.2f')} "
            f"{_fmt(v['median_phase_s'], '7.2f')} {_fmt(v['median_tail_s'], '6.2f')} "
            f"{_fmt(v['median_cpu_s'], '6.2f')} {v['warm_up_wall_s']:>9.2f} "
            f"{'yes' if v['all_ok'] else 'NO':>3}"
        )
    print(
        "  wall: process start to exit; phase: rollout phase; tail: last rollout to exit;\n"
        "  CPU: the process tree's (vfops: + its registry and tracker children), all medians;\n"
        "  warm-up: the first run of each variant (not counted); ok: every run completed\n"
        "  (vfops: and recorded at exit, no process outliving it)."
    )
    for v in data["variants"]:
        if v["tool"] in VFOPS_TOOLS:
            what = "registry" if v["variant"] == "no-tracking" else "registry + MLflow"
            print(
                f"  {v['variant']}: recorded at exit ({what}) in {v['recorded']} of "
                f"{v['runs']} runs (warm-up included)"
            )
    exact = w["n"] == BAR_SHORT["n"] and w["r"] == BAR_SHORT["r"] and w["latency_ms"] == 0
    defaults = next(v for v in data["variants"] if v["variant"] == "defaults")
    median = defaults["median_wall_s"]
    ok = None if median is None else defaults["all_ok"] and median <= BAR_SHORT_WALL_S
    return [
        Bar("2", f"{BAR_SHORT['n'] * BAR_SHORT['r']}-rollout eval, 0 ms, defaults on, "
            f"recorded at exit: median wall of {data['repeats']}",
            f"{_fmt(median, '.2f')} s (min {_fmt(defaults['min_wall_s'], '.2f')})",
            f"<= {BAR_SHORT_WALL_S:g} s", ok, exact)
    ]  # fmt: skip


def print_memory(data: dict[str, Any]) -> list[Bar]:
    run = data["run"]
    w = data["workload"]
    print()
    print(f"[3] memory: {data['settings']}")
    print(f"    vfops: {data['command']}")
    phases = ", ".join(f"{k} {v:.0f} MB" for k, v in run["peak_rss_by_phase_mb"].items())
    procs = ", ".join(f"{k} {v:.0f} MB" for k, v in run["peak_rss_by_process_mb"].items())
    pss = ", ".join(f"{k} {v:.0f} MB" for k, v in run.get("peak_pss_by_process_mb", {}).items())
    parts = ", ".join(f"{k} {v:.0f}" for k, v in run.get("tree_peak_parts_mb", {}).items())
    print(
        f"  {run['rollouts']:,}/{run['planned']:,} rollouts in {run['wall_s']:.1f} s "
        f"(rollout phase {_fmt(run['phase_wall_s'], '.1f')} s)\n"
        f"  peak RSS, whole process tree (vfops + its children: tracker, registry; sampled\n"
        f"     together):                                             "
        f"{run['tree_peak_rss_mb']:7.1f} MB ({run['max_tree_processes']} processes at most)\n"
        f"     in that sample (MB):                                   {parts or '-'}\n"
        f"  peak PSS, whole process tree (pages shared by forked processes counted once;\n"
        f"     context, not the bar):                                 "
        f"{run.get('tree_peak_pss_mb', 0.0):7.1f} MB; each process's PSS peak: {pss or '-'}\n"
        f"  peak RSS, vfops process (kernel high-water mark VmHWM):   "
        f"{run['peak_rss_mb']:7.1f} MB\n"
        f"     its RSS peak by phase (sampled):                       {phases or '-'}\n"
        f"  each process's own peak (VmHWM, sampled):                 {procs or '-'}\n"
        f"  largest single process' peak (wait4 ru_maxrss):            "
        f"{run['largest_process_maxrss_mb']:7.1f} MB\n"
        f"  last rollout -> process exit:                              "
        f"{_fmt(run['last_rollout_to_exit_s'], '7.2f')} s "
        f"(-> metadata.json written: {_fmt(run['last_rollout_to_metadata_s'], '.2f')} s)\n"
        f"  the time of the last rollout = the last modification time of results.jsonl\n"
        f"  (appended once per group; stat-ed after the process exited); the exit time is\n"
        f"  when the bench's wait4 on the vfops process returned. {run['samples']} samples,\n"
        f"  one every {SAMPLE_INTERVAL_S:g} s.\n"
        f"  recorded at exit: {'yes' if run['recorded'] else 'NO'}; processes outliving vfops: "
        f"{len(run['survivors']) or 'none'}"
    )
    exact = {k: w[k] for k in ("n", "r", "c")} == BAR_MEMORY and w["latency_ms"] == 0
    tail = run["last_rollout_to_exit_s"]
    what = f"{BAR_MEMORY['n'] * BAR_MEMORY['r']:,} rollouts, -c {BAR_MEMORY['c']}, 0 ms"
    return [
        Bar("3a", f"peak RSS of the process tree, {what}",
            f"{run['tree_peak_rss_mb']:.0f} MB (vfops process {run['peak_rss_mb']:.0f} MB; "
            f"tree PSS {run.get('tree_peak_pss_mb', 0.0):.0f} MB)",
            f"<= {BAR_PEAK_RSS_MB:g} MB",
            run["ok"] and run["tree_peak_rss_mb"] <= BAR_PEAK_RSS_MB, exact),
        Bar("3b", "last rollout -> process exit, recorded", f"{_fmt(tail, '.2f')} s",
            f"<= {BAR_TAIL_S:g} s",
            None if tail is None else run["ok"] and tail <= BAR_TAIL_S, exact),
    ]  # fmt: skip


def print_bars(bars: list[Bar]) -> None:
    print()
    print("bars:")
    width = max(len(b.what) for b in bars)
    mwidth = max(len(b.measured) for b in bars)
    twidth = max(len(b.target) for b in bars)
    for b in bars:
        print(
            f"  {b.name:<3} {b.what:<{width}}  {b.measured:>{mwidth}}  {b.target:<{twidth}}  "
            f"{b.verdict()}"
        )
    if not all(b.bar_workload for b in bars):
        print("  * not the bar's workload (--quick or changed sizes): indicative only")


# ---------------------------------------------------------------- main


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 2 repeats")
    parser.add_argument(
        "--skip-verifiers", action="store_true",
        help="vfops on its own env only: no vf-eval, no vfops-vf (the verifiers adapter)",
    )  # fmt: skip
    parser.add_argument(
        "--only", default=",".join(DEFAULT_PARTS),
        help=f"comma-separated parts to run: {', '.join(PARTS)} (default: "
        f"{','.join(DEFAULT_PARTS)}; throughput includes verifiers-adapter's rows)",
    )  # fmt: skip
    parser.add_argument("-n", "--num-examples", type=int, default=None, help="throughput -n")
    parser.add_argument("-r", "--rollouts-per-example", type=int, default=BAR_THROUGHPUT["r"])
    parser.add_argument("-c", "--max-concurrent", type=int, default=BAR_THROUGHPUT["c"])
    parser.add_argument(
        "--latencies", default=f"{BAR_LATENCY_MS:g}",
        help="throughput stub latencies in ms, comma-separated (bar 1 is judged at 200)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=None, help="short-eval runs (default 5)")
    parser.add_argument("--memory-examples", type=int, default=None, help="memory -n")
    parser.add_argument("--memory-concurrency", type=int, default=BAR_MEMORY["c"])
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep run folders under .bench/")
    args = parser.parse_args()
    args.parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        parser.error(f"--only: unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    if args.skip_verifiers and args.parts == ["verifiers-adapter"]:
        parser.error("--only verifiers-adapter runs verifiers only; drop --skip-verifiers")
    return args


def _versions(vf_eval: Path | None, adapter: bool) -> dict[str, str]:
    packages = ["vfops", "openai", "mlflow", "sqlalchemy"] + (["verifiers"] if adapter else [])
    project = venv_versions(Path(sys.executable), packages)
    if adapter:
        project["verifiers (project venv, vfops-vf)"] = project.pop("verifiers")
    versions = {
        "python": platform.python_version(),
        **project,
        "vfops source": _vfops_source(),
        "cpus": str(os.cpu_count()),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpu calibration": f"{_calibration_s():.2f} s",
    }
    if vf_eval is not None:
        vfv = venv_versions(VF_VENV / "bin" / "python", ["verifiers", "openai"])
        versions["verifiers"] = vfv["verifiers"]
        versions["openai (verifiers venv)"] = vfv["openai"]
    return versions


def _calibration_s() -> float:
    """CPU seconds of a fixed pure-Python loop (``sum(range(3 * 10**7))``, best of 3):
    the speed of this machine's core, to compare figures across machines and days
    (0.85-1.0 s on the 2-core machine of 2026-12-02; the MLflow start-up of the
    tracker scales with it)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        sum(range(3 * 10**7))
        best = min(best, time.process_time() - start)
    return best


def _project_has_verifiers() -> bool:
    """Whether the project venv has ``verifiers`` (the ``[verifiers]`` extra) for vfops-vf."""
    if venv_versions(Path(sys.executable), ["verifiers"])["verifiers"] != "-":
        return True
    print(
        "vfops-vf skipped: verifiers is not installed in the project venv "
        "(pip install -e '.[verifiers]'); bar 1d is n/a",
        flush=True,
    )
    return False


def compile_sources() -> None:
    """Byte-compile the sources both tools run from a checkout (vfops, its environments,
    the verifiers twin), as pip does for an installed package: with
    PYTHONDONTWRITEBYTECODE set (as on these machines) an editable install would
    otherwise compile every module at every start (~0.4 s for vfops)."""
    folders = [ROOT / "vfops", ROOT / "environments", ROOT / "bench" / "vf_arithmetic"]
    if VF_ENVS.exists():
        folders.append(VF_ENVS)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *map(str, folders)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    args = _parse_args()
    throughput = Workload(
        args.num_examples or (50 if args.quick else BAR_THROUGHPUT["n"]),
        args.rollouts_per_example,
        args.max_concurrent,
        BAR_LATENCY_MS,
    )
    short = Workload(BAR_SHORT["n"], BAR_SHORT["r"], SHORT_CONCURRENCY, 0.0)
    repeats = args.repeats or (2 if args.quick else 5)
    memory_n = args.memory_examples or (1000 if args.quick else BAR_MEMORY["n"])
    memory = Workload(
        memory_n, BAR_MEMORY["r"], args.memory_concurrency, 0.0, {"num_examples": memory_n}
    )
    latencies = [float(x) for x in args.latencies.split(",") if x]

    needs_vf = {"throughput", "verifiers-adapter", "short"} & set(args.parts)
    vf_eval = None if args.skip_verifiers or not needs_vf else ensure_verifiers_venv()
    adapter = (
        not args.skip_verifiers
        and bool({"throughput", "verifiers-adapter"} & set(args.parts))
        and _project_has_verifiers()
    )
    if adapter:
        ensure_vf_envs()
    compile_sources()
    tools = ["vfops"] + (["vf-eval"] if vf_eval is not None else [])
    # vfops-vf next to vf-eval: the rows of bar 1d
    throughput_tools = ["vfops"] + (["vfops-vf"] if adapter else []) + tools[1:]
    versions = _versions(vf_eval, adapter)
    if not _become_subreaper():  # else only the processes the sampler saw are checked
        print("note: not a child subreaper; survivors are those seen in 0.1 s samples", flush=True)

    BENCH_DIR.mkdir(exist_ok=True)
    work = BENCH_DIR / "eval_overhead" / time.strftime("%Y%m%dT%H%M%S")
    work.mkdir(parents=True)
    bench = Bench(work, vf_eval)
    summary: dict[str, Any] = {"quick": args.quick, "parts": args.parts}
    bars: list[Bar] = []
    try:
        if "throughput" in args.parts:
            summary["throughput"] = part_throughput(
                bench, throughput_tools, throughput, latencies=latencies
            )
        elif "verifiers-adapter" in args.parts:  # throughput has these rows already
            summary["verifiers-adapter"] = part_throughput(
                bench, [t for t in throughput_tools if t != "vfops"], throughput,
                latencies=latencies, part="verifiers-adapter",
            )  # fmt: skip
        if "short" in args.parts:
            summary["short"] = part_short(bench, tools, short, repeats=repeats)
        if "memory" in args.parts:
            summary["memory"] = part_memory(bench, memory)
        print()
        competitor = f", vf-eval {VERIFIERS_VERSION}" if vf_eval else ""
        print(
            f"vfops eval overhead — measured as a user runs it: every figure is the whole "
            f"process, start to exit,\nwith the defaults on (registry + MLflow tracking with "
            f"traces in a bench-private VFOPS_HOME{competitor});\n"
            f"each vfops run checked recorded at exit (registry + MLflow) right after it."
        )
        if "throughput" in summary:
            bars += print_throughput(summary["throughput"])
        if "verifiers-adapter" in summary:
            bars += print_throughput(summary["verifiers-adapter"])
        if "short" in summary:
            bars += print_short(summary["short"])
        if "memory" in summary:
            bars += print_memory(summary["memory"])
        print_bars(bars)
        print()
        print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        summary["bars"] = [b.__dict__ | {"verdict": b.verdict()} for b in bars]
        summary["versions"] = versions
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2))
    finally:
        if args.keep:
            print(f"run folders kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
