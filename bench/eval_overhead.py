"""Eval overhead benchmark: ``vfops eval`` vs ``vf-eval`` (verifiers) on the same stub.

For each stub latency (0 ms and 200 ms) one stub server subprocess serves both
clients, run one after the other as separate subprocesses: ``vfops eval
arithmetic`` and ``vf-eval vf_arithmetic`` (``bench/vf_arithmetic``, the same
questions, parser and rewards on ``verifiers``' legacy ``vf.SingleTurnEnv``),
each with N examples x R rollouts at concurrency C and ``max_tokens`` 256.
``verifiers`` lives in its own virtualenv, ``.bench/verifiers-venv``, created on
first use (pinned: ``VERIFIERS_VERSION``).

Per run it measures the client's wall time, its CPU time (user+sys of the
client's whole process tree, via ``getrusage(RUSAGE_CHILDREN)`` deltas, checked
against psutil samples; the stub's CPU is not included) and the rollouts
actually written to ``results.jsonl``. Rates are given end-to-end (process start
to exit: imports, env load, rollouts, result files) and for the rollout phase
alone (vfops: ``summary.wall_s`` in metadata.json; vf-eval: ``time`` in its
metadata.json). Start-up is measured by a separate ``-n 1 -r 1`` run of each
tool; "marginal" CPU per rollout is (CPU of the full run - CPU of that run) /
(rollouts - 1). vfops always exports a ``datasets`` copy of the results at the
end (there is no flag to turn it off); it is included in end-to-end numbers.

Then a memory check: ``vfops eval arithmetic -n 10000 -r 2 -c 128`` (20,000
rollouts) against the 0 ms stub, sampling the vfops process RSS every 0.2 s.

    .venv/bin/python bench/eval_overhead.py            # full run (~5 min)
    .venv/bin/python bench/eval_overhead.py --quick    # smoke run
    .venv/bin/python bench/eval_overhead.py --skip-verifiers
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _venvs import ensure_venv, venv_versions  # bench/ is sys.path[0] when run as a script

from vfops.testing import StubConfig, StubServer

VERIFIERS_VERSION = "0.3.1"
"""verifiers 0.4.0 replaced the legacy ``vf-eval`` (env modules with
``load_environment``; -n/-r/-c/-b/-k flags) by a taskset CLI; 0.3.1 is the last
release whose ``vf-eval`` runs a ``vf.SingleTurnEnv`` module like vfops' envs."""

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / ".bench"
VF_VENV = BENCH_DIR / "verifiers-venv"
VF_ENV_DIR = ROOT / "bench" / "vf_arithmetic"
VFOPS_BIN = Path(sys.executable).parent / "vfops"
API_KEY_VAR = "BENCH_DUMMY_API_KEY"
MODEL = "stub-model"
MAX_TOKENS = 256
SAMPLE_INTERVAL_S = 0.2


# ---------------------------------------------------------------- setup


def _stamp() -> str:
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


# ---------------------------------------------------------------- measuring


@dataclass
class RunResult:
    tool: str
    latency_ms: float
    planned: int
    wall_s: float
    cpu_s: float
    rollouts: int = 0
    errors: int = 0
    reward_mean: float = float("nan")
    phase_wall_s: float | None = None
    returncode: int = 0
    peak_rss_mb: float = 0.0
    rss_samples: list[tuple[float, float, str]] = field(default_factory=list)
    log: str = ""

    @property
    def rate(self) -> float:
        return self.rollouts / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def phase_rate(self) -> float | None:
        if not self.phase_wall_s:
            return None
        return self.rollouts / self.phase_wall_s

    @property
    def cpu_ms_per_rollout(self) -> float:
        return self.cpu_s / self.rollouts * 1000.0 if self.rollouts else float("nan")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _TreeSampler(threading.Thread):
    """Samples a process tree every SAMPLE_INTERVAL_S: CPU (last seen per pid) and RSS."""

    def __init__(self, pid: int, run_dir_glob: tuple[Path, str] | None) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.cpu_by_pid: dict[int, float] = {}
        self.rss: list[tuple[float, float, str]] = []  # (t, root RSS MB, phase)
        self._stop_event = threading.Event()
        self._run_dir_glob = run_dir_glob
        self._t0 = time.perf_counter()

    def _phase(self) -> str:
        if self._run_dir_glob is None:
            return ""
        base, pattern = self._run_dir_glob
        results = next(iter(base.glob(pattern)), None)
        if results is None or results.stat().st_size == 0:
            return "startup"
        try:
            meta = json.loads((results.parent / "metadata.json").read_bytes())
        except (OSError, ValueError):
            return "rollouts"
        return "rollouts" if meta.get("status") == "running" else "finish"

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                times = proc.cpu_times()
                self.cpu_by_pid[proc.pid] = times.user + times.system
                if proc.pid == self.root.pid:
                    rss = proc.memory_info().rss / 2**20
                    self.rss.append((time.perf_counter() - self._t0, rss, self._phase()))
            except psutil.Error:
                continue

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_INTERVAL_S):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run_client(
    tool: str,
    argv: list[str],
    *,
    out_dir: Path,
    latency_ms: float,
    planned: int,
    results_glob: str,
) -> RunResult:
    """Run one client subprocess to completion and measure it."""
    out_dir = out_dir.resolve()  # the client runs with cwd=out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        API_KEY_VAR: "dummy",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "NO_COLOR": "1",
        "TERM": "dumb",
        # vfops records runs in its registry (on by default): a private SQLite home
        "VFOPS_HOME": str(out_dir / "vfops-home"),
    }
    log_path = out_dir / "client.log"
    with log_path.open("w") as log:
        cpu0 = _children_cpu()
        wall0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=out_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        sampler = _TreeSampler(proc.pid, (out_dir, results_glob))
        sampler.start()
        returncode = proc.wait()
        wall = time.perf_counter() - wall0
        sampler.stop()
        cpu = _children_cpu() - cpu0
    # A descendant its parent never reaped is missing from RUSAGE_CHILDREN; the
    # psutil samples (a lower bound: up to 0.2 s late per process) cover it.
    cpu = max(cpu, sum(sampler.cpu_by_pid.values()))
    result = RunResult(
        tool=tool,
        latency_ms=latency_ms,
        planned=planned,
        wall_s=wall,
        cpu_s=cpu,
        returncode=returncode,
        rss_samples=sampler.rss,
        peak_rss_mb=max((s[1] for s in sampler.rss), default=0.0),
        log=log_path.read_text(errors="replace")[-3000:],
    )
    results_file = next(iter(out_dir.glob(results_glob)), None)
    if results_file is not None:
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
        if rewards:
            result.reward_mean = sum(rewards) / len(rewards)
        meta_path = results_file.parent / "metadata.json"
        if meta_path.exists():
            meta = json.loads(meta_path.read_bytes())
            if tool == "vfops":
                result.phase_wall_s = (meta.get("summary") or {}).get("wall_s")
            else:
                result.phase_wall_s = meta.get("time")
    if returncode != 0 or result.rollouts == 0:
        print(f"  !! {tool} exited {returncode} with {result.rollouts} rollouts; log tail:")
        print("     " + result.log[-1500:].replace("\n", "\n     "))
    return result


def vfops_argv(base_url: str, n: int, r: int, c: int, out: Path, extra: list[str]) -> list[str]:
    return [
        str(VFOPS_BIN), "eval", "arithmetic", "-m", MODEL, "-b", base_url, "-k", API_KEY_VAR,
        "-n", str(n), "-r", str(r), "-c", str(c), "-t", str(MAX_TOKENS),
        "-o", str(out / "outputs"), "--quiet", *extra,
    ]  # fmt: skip


def vf_eval_argv(vf_eval: Path, base_url: str, n: int, r: int, c: int, out: Path) -> list[str]:
    # -s: save results.jsonl (what we count); -d: plain logging instead of the Rich
    # live display (the cheaper of the two; vfops runs with --quiet).
    return [
        str(vf_eval), "vf_arithmetic", "-m", MODEL, "-b", base_url, "-k", API_KEY_VAR,
        "-n", str(n), "-r", str(r), "-c", str(c), "-t", str(MAX_TOKENS),
        "-o", str(out / "outputs"), "-s", "-d",
    ]  # fmt: skip


RESULTS_GLOB = {
    "vfops": "outputs/evals/arithmetic--*/*/results.jsonl",
    "vf-eval": "outputs/evals/vf_arithmetic--*/*/results.jsonl",
}


def measure(
    tool: str,
    base_url: str,
    latency_ms: float,
    n: int,
    r: int,
    c: int,
    work: Path,
    vf_eval: Path | None,
) -> tuple[RunResult, RunResult]:
    """(start-up run with -n 1 -r 1, full run)."""
    out: list[RunResult] = []
    for label, nn, rr in (("startup", 1, 1), ("full", n, r)):
        out_dir = work / f"{tool}-{latency_ms:g}ms-{label}"
        if tool == "vfops":
            argv = vfops_argv(base_url, nn, rr, c, out_dir, [])
        else:
            assert vf_eval is not None
            argv = vf_eval_argv(vf_eval, base_url, nn, rr, c, out_dir)
        res = run_client(
            tool, argv, out_dir=out_dir, latency_ms=latency_ms, planned=nn * rr,
            results_glob=RESULTS_GLOB[tool],
        )  # fmt: skip
        print(
            f"  {tool:<8} {label:<8} {res.rollouts:>6}/{nn * rr} rollouts  "
            f"wall {res.wall_s:6.2f} s  phase {_fmt(res.phase_wall_s, '6.2f')} s  "
            f"CPU {res.cpu_s:6.2f} s  reward {res.reward_mean:.3f}",
            flush=True,
        )
        out.append(res)
    return out[0], out[1]


def memory_check(base_url: str, n: int, r: int, c: int, work: Path) -> dict[str, Any]:
    out_dir = work / "vfops-memory"
    argv = vfops_argv(base_url, n, r, c, out_dir, ["-a", json.dumps({"num_examples": n})])
    res = run_client(
        "vfops", argv, out_dir=out_dir, latency_ms=0.0, planned=n * r,
        results_glob=RESULTS_GLOB["vfops"],
    )  # fmt: skip
    samples = res.rss_samples
    rollout_samples = [s for s in samples if s[2] == "rollouts"]
    baseline = rollout_samples[0][1] if rollout_samples else (samples[0][1] if samples else 0.0)
    peak_rollouts = max((s[1] for s in rollout_samples), default=baseline)
    peak_all = max((s[1] for s in samples), default=baseline)
    return {
        "rollouts": res.rollouts,
        "planned": n * r,
        "wall_s": res.wall_s,
        "phase_wall_s": res.phase_wall_s,
        "first_rss_mb": samples[0][1] if samples else 0.0,
        "baseline_rss_mb": baseline,
        "peak_rss_rollouts_mb": peak_rollouts,
        "peak_rss_mb": peak_all,
        "growth_rollouts_mb": peak_rollouts - baseline,
        "growth_mb": peak_all - baseline,
        "samples": len(samples),
        "returncode": res.returncode,
    }


# ---------------------------------------------------------------- report


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(
    rows: dict[tuple[str, float], tuple[RunResult, RunResult]],
    latencies: list[float],
    c: int,
    memory: dict[str, Any] | None,
    versions: dict[str, str],
    n: int,
    r: int,
) -> dict[str, Any]:
    tools = [t for t in ("vfops", "vf-eval") if any((t, lat) in rows for lat in latencies)]
    print()
    print(
        f"eval overhead: {n} examples x {r} rollouts = {n * r} rollouts, -c {c}, "
        f"max_tokens {MAX_TOKENS}, single-turn arithmetic, stub reply-mode arithmetic"
    )
    header = (
        f"{'tool':<8} {'latency':>7} {'done':>6} {'e2e/s':>8} {'phase/s':>8} "
        f"{'%bound':>11} {'CPU ms/r':>9} {'marg ms/r':>9} {'start s':>8} {'startCPU':>8}"
    )
    print(header)
    print("-" * len(header))
    summary: dict[str, Any] = {"rows": [], "bars": []}
    for latency in latencies:
        for tool in tools:
            if (tool, latency) not in rows:
                continue
            start, full = rows[(tool, latency)]
            bound = c / (latency / 1000.0) if latency > 0 else None
            pct = (
                f"{full.rate / bound * 100:4.0f}/{(full.phase_rate or 0) / bound * 100:4.0f}%"
                if bound
                else "-"
            )
            marginal = (
                (full.cpu_s - start.cpu_s) / (full.rollouts - 1) * 1000.0
                if full.rollouts > 1
                else float("nan")
            )
            print(
                f"{tool:<8} {latency:>5.0f}ms {full.rollouts:>6} {full.rate:>8.1f} "
                f"{_fmt(full.phase_rate, '8.1f')} {pct:>11} {full.cpu_ms_per_rollout:>9.3f} "
                f"{marginal:>9.3f} {start.wall_s:>8.2f} {start.cpu_s:>8.2f}"
            )
            summary["rows"].append(
                {
                    "tool": tool,
                    "latency_ms": latency,
                    "rollouts": full.rollouts,
                    "errors": full.errors,
                    "planned": full.planned,
                    "wall_s": full.wall_s,
                    "phase_wall_s": full.phase_wall_s,
                    "rollouts_per_s": full.rate,
                    "phase_rollouts_per_s": full.phase_rate,
                    "cpu_s": full.cpu_s,
                    "cpu_ms_per_rollout": full.cpu_ms_per_rollout,
                    "marginal_cpu_ms_per_rollout": marginal,
                    "startup_wall_s": start.wall_s,
                    "startup_cpu_s": start.cpu_s,
                    "reward_mean": full.reward_mean,
                    "bound_per_s": bound,
                }
            )
    print(
        "e2e/s: rollouts / process wall time; phase/s: rollouts / rollout-phase wall time; "
        "%bound: e2e/phase vs C/latency;\nCPU ms/r: client process-tree CPU / rollouts "
        "(start-up included); marg ms/r: (CPU - start-up run CPU) / (rollouts - 1); "
        "start s / startCPU: wall and CPU of a -n 1 -r 1 run."
    )
    if "vf-eval" in tools:
        print()
        for latency in latencies:
            if ("vfops", latency) in rows and ("vf-eval", latency) in rows:
                a, b = rows[("vfops", latency)][1], rows[("vf-eval", latency)][1]
                phase = a.phase_rate / b.phase_rate if a.phase_rate and b.phase_rate else None
                cpu = b.cpu_ms_per_rollout / a.cpu_ms_per_rollout
                print(
                    f"ratio vfops/vf-eval @ {latency:.0f} ms: rollouts/s x{a.rate / b.rate:.2f} "
                    f"end-to-end, x{_fmt(phase, '.2f')} rollout phase; "
                    f"vf-eval uses x{cpu:.2f} the CPU per rollout"
                )
                summary.setdefault("ratios", []).append(
                    {"latency_ms": latency, "e2e": a.rate / b.rate, "phase": phase, "cpu": cpu}
                )

    # Bars.
    bars: list[tuple[str, bool]] = []
    hi = max(latencies)
    if ("vfops", hi) in rows and hi > 0:
        start, full = rows[("vfops", hi)]
        bound = c / (hi / 1000.0)
        bars.append(
            (f"vfops @ {hi:.0f} ms >= 85% of C/latency ({bound:.0f}/s), rollout phase: "
             f"{(full.phase_rate or 0) / bound * 100:.1f}%",
             (full.phase_rate or 0) >= 0.85 * bound)
        )  # fmt: skip
        bars.append(
            (f"vfops @ {hi:.0f} ms >= 85% of C/latency ({bound:.0f}/s), end-to-end: "
             f"{full.rate / bound * 100:.1f}%",
             full.rate >= 0.85 * bound)
        )  # fmt: skip
        if ("vf-eval", hi) in rows:
            other = rows[("vf-eval", hi)][1]
            if full.phase_rate and other.phase_rate:
                bars.append(
                    (f"vfops @ {hi:.0f} ms >= 10x vf-eval rollouts/s, rollout phase: "
                     f"x{full.phase_rate / other.phase_rate:.2f}",
                     full.phase_rate >= 10 * other.phase_rate)
                )  # fmt: skip
            bars.append(
                (f"vfops @ {hi:.0f} ms >= 10x vf-eval rollouts/s, end-to-end: "
                 f"x{full.rate / other.rate:.2f}",
                 full.rate >= 10 * other.rate)
            )  # fmt: skip
    for latency in latencies:
        if ("vfops", latency) in rows:
            start, full = rows[("vfops", latency)]
            marginal = (full.cpu_s - start.cpu_s) / max(1, full.rollouts - 1) * 1000.0
            bars.append(
                (f"vfops @ {latency:.0f} ms <= 2 ms client CPU/rollout, all-in: "
                 f"{full.cpu_ms_per_rollout:.3f} ms", full.cpu_ms_per_rollout <= 2.0)
            )  # fmt: skip
            bars.append(
                (f"vfops @ {latency:.0f} ms <= 2 ms client CPU/rollout, marginal: "
                 f"{marginal:.3f} ms", marginal <= 2.0)
            )  # fmt: skip
    if memory is not None:
        print()
        print(
            f"memory: vfops, {memory['rollouts']}/{memory['planned']} rollouts @ 0 ms, "
            f"-c {c}, {memory['wall_s']:.1f} s: RSS {memory['first_rss_mb']:.0f} MB at the first "
            f"sample, baseline {memory['baseline_rss_mb']:.0f} MB (first results), "
            f"peak {memory['peak_rss_rollouts_mb']:.0f} MB during rollouts "
            f"(+{memory['growth_rollouts_mb']:.0f} MB), {memory['peak_rss_mb']:.0f} MB "
            f"incl. the final dataset export (+{memory['growth_mb']:.0f} MB); "
            f"{memory['samples']} samples every {SAMPLE_INTERVAL_S} s"
        )
        bars.append(
            (f"vfops RSS growth < 200 MB over {memory['planned']} rollouts: "
             f"+{memory['growth_mb']:.0f} MB", memory["growth_mb"] < 200.0
             and memory["rollouts"] == memory["planned"])
        )  # fmt: skip
    print()
    print("bars:")
    for text, ok in bars:
        print(f"  [{_verdict(ok)}] {text}")
        summary["bars"].append({"bar": text, "pass": ok})
    print()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    summary["memory"] = memory
    summary["versions"] = versions
    return summary


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small n")
    parser.add_argument("--skip-verifiers", action="store_true", help="vfops only")
    parser.add_argument("--skip-memory", action="store_true", help="no 20,000-rollout check")
    parser.add_argument("-n", "--num-examples", type=int, default=None)
    parser.add_argument("-r", "--rollouts-per-example", type=int, default=2)
    parser.add_argument("-c", "--max-concurrent", type=int, default=128)
    parser.add_argument("--latencies", default="0,200", help="stub latency in ms, comma-separated")
    parser.add_argument("--memory-examples", type=int, default=None, help="memory check -n")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep run folders under .bench/")
    args = parser.parse_args()

    n = args.num_examples or (50 if args.quick else 1000)
    r, c = args.rollouts_per_example, args.max_concurrent
    memory_n = args.memory_examples or (500 if args.quick else 10000)
    latencies = [float(x) for x in args.latencies.split(",") if x]

    vf_eval = None if args.skip_verifiers else ensure_verifiers_venv()
    versions = {
        "python": platform.python_version(),
        **{k: v for k, v in venv_versions(Path(sys.executable), ["vfops", "openai"]).items()},
        "cpus": str(os.cpu_count()),
    }
    if vf_eval is not None:
        vfv = venv_versions(VF_VENV / "bin" / "python", ["verifiers", "openai"])
        versions["verifiers"] = vfv["verifiers"]
        versions["openai (verifiers venv)"] = vfv["openai"]

    BENCH_DIR.mkdir(exist_ok=True)
    work = BENCH_DIR / "eval_overhead" / time.strftime("%Y%m%dT%H%M%S")
    work.mkdir(parents=True)
    rows: dict[tuple[str, float], tuple[RunResult, RunResult]] = {}
    memory: dict[str, Any] | None = None
    try:
        for latency in latencies:
            config = StubConfig(latency_ms=latency, reply_mode="arithmetic")
            with StubServer(config, subprocess=True) as stub:
                print(f"stub latency {latency:.0f} ms at {stub.base_url}", flush=True)
                for tool in ("vfops", "vf-eval"):
                    if tool == "vf-eval" and vf_eval is None:
                        continue
                    rows[(tool, latency)] = measure(
                        tool, stub.base_url, latency, n, r, c, work, vf_eval
                    )
                if latency == 0 and not args.skip_memory:
                    print(f"  memory check: vfops {memory_n} x {r} rollouts ...", flush=True)
                    memory = memory_check(stub.base_url, memory_n, r, c, work)
                stats = stub.stats
                print(f"  stub served {stats['ok']} ok / {stats['requests']} requests")
        if not args.skip_memory and memory is None:
            with StubServer(StubConfig(reply_mode="arithmetic"), subprocess=True) as stub:
                print(f"  memory check: vfops {memory_n} x {r} rollouts ...", flush=True)
                memory = memory_check(stub.base_url, memory_n, r, c, work)
        summary = report(rows, latencies, c, memory, versions, n, r)
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
