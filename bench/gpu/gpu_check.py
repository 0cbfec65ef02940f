"""The trainer's GPU check: one script, one JSON file, under 8 minutes on one GPU.

For a machine with a GPU and no package registry (a short device lease). It measures:

1. ``hf``: bf16 GRPO steps of a small random model (``GRPORecipe``, the in-process
   ``hf`` backend): step, generation and training seconds, tokens/s, peak memory;
2. ``vllm_generation``: generation tokens/s through a vLLM server on the same model
   (``VLLMBackend``'s client, the path training uses), when vLLM is importable;
3. ``vllm_sync_filesystem`` / ``vllm_sync_nccl``: GRPO steps with the ``vllm``
   backend, and the share of each step spent in weight sync; with the mismatch
   between vLLM's and the trainer's log-probs (what ``loss.importance_correction``
   corrects). NCCL needs the trainer and the server on different GPUs: with one GPU
   it is reported as skipped, with the reason;
4. ``train_tokens_sdpa`` / ``train_tokens_flash_attention_2``: training tokens/s of the
   optimiser step alone on a fixed batch of sequences of varied lengths, with padded
   and with packed micro-batches (``[optim] packing``), per attention implementation
   (``[model] attn_implementation``); flash only where flash-attn is installed.

First it checks what it needs and names what is missing in one line (and in the
JSON), then runs what it can. Each part is a subprocess with its own deadline, inside
one overall budget (``--budget-s``, default 450 s), so a hang (an NCCL rendezvous)
costs its part only; the JSON is rewritten after every part.

    python3 bench/gpu/gpu_check.py --out $OUT/gpu_check.json
    python3 bench/gpu/gpu_check.py --vllm-python /opt/vllm/bin/python --out gpu_check.json
    .venv/bin/python bench/gpu/gpu_check.py --cpu --out /tmp/gpu_check.json  # CPU rehearsal

``--cpu``: the same parts on a CPU (fp32, the tiny model, vLLM's CPU build from
``--vllm-python`` or ``$VFOPS_VLLM_PYTHON``), to check the script before a lease.
See bench/gpu/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LUCKY_DIGIT = REPO / "environments" / "lucky_digit"
sys.path[:0] = [str(REPO), str(LUCKY_DIGIT)]

# What the trainer's path needs beyond the standard library (vfops itself comes from this
# checkout): import name -> pip name. The probe below then imports the path for real and
# names anything this list missed.
TRAINER_NEEDS = {
    "torch": "torch",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "jinja2": "jinja2",
    "pydantic": "pydantic",
    "typer": "typer",
    "aiohttp": "aiohttp",
    "orjson": "orjson",
    "numpy": "numpy",
    "datasets": "datasets",
}
IMPORT_PROBE = (
    "import lucky_digit, accelerate, transformers; "
    "import vfops.training._recipe, vfops.training._generation_hf, vfops.training._vllm, "
    "vfops.cli._vllm, vfops.local"
)
TRAIN_TOKENS_S = 120.0
"""The longest a train_tokens part may take (model load, then 2 x (warm-up + steps))."""
ATTENTION = ("sdpa", "flash_attention_2")
"""The attention implementations the train_tokens parts compare."""
SERVER_START_S = {"cuda": 300.0, "cpu": 240.0}
"""Longest wait for vLLM to answer (GPU: compile and CUDA graphs)."""
PART_MIN_S = {"hf": 60.0, "vllm_sync": 60.0, "train_tokens": 45.0}
"""A part is skipped when less than this is left of the budget."""

# (hidden, layers, heads, MLP): ~150M parameters on a GPU, head_dim 64 (vLLM's CPU
# build rejects smaller heads)
GPU_MODEL = {
    "hidden_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "intermediate_size": 2816,
}
CPU_MODEL: dict[str, int] = {}  # vfops.local's default tiny model (2 layers, hidden 128)


# ---------------------------------------------------------------- what is there


def missing_modules(names: dict[str, str]) -> list[str]:
    """The pip names of what is missing: the known list at once, then whatever a real
    import of the trainer's path still lacks (one at a time: it stops at the first)."""
    missing = [pip for module, pip in names.items() if importlib.util.find_spec(module) is None]
    if missing:
        return missing
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(LUCKY_DIGIT)])}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode == 0:
        return []
    found = re.search(r"No module named '([^'.]+)", done.stderr)
    return [found[1] if found else "? (" + " ".join(done.stderr.split())[-300:] + ")"]


def vllm_python(args: argparse.Namespace) -> tuple[str | None, str]:
    """A Python that imports vllm (``--vllm-python``, ``$VFOPS_VLLM_PYTHON``, this one),
    or None and why not."""
    candidates = [args.vllm_python, os.environ.get("VFOPS_VLLM_PYTHON"), sys.executable]
    tried = []
    for python in dict.fromkeys(c for c in candidates if c):
        tried.append(python)
        try:
            done = subprocess.run(
                [python, "-c", "import vllm; print(vllm.__version__)"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return python, done.stdout.strip().splitlines()[-1]
    return None, f"vllm is not importable by {', '.join(tried)}"


def machine(cpu: bool) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if info["gpus"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["bf16"] = torch.cuda.is_bf16_supported()
    import transformers

    info["transformers"] = transformers.__version__
    info["mode"] = "cpu rehearsal" if cpu else "gpu"
    return info


# ---------------------------------------------------------------- parts (subprocesses)


def _config(spec: dict[str, Any], backend: str, out: Path, **generation: Any) -> Any:
    from vfops.training import GRPOConfig

    return GRPOConfig(
        model={"path": spec["model_dir"], "name": "gpu-check"},
        environment={"id": "lucky_digit", "args": {"digits": "0123456789"}},
        generation={
            "backend": backend,
            "prompts_per_step": spec["prompts_per_step"],
            "group_size": spec["group_size"],
            "max_tokens": spec["max_tokens"],
            "max_batch_size": spec["prompts_per_step"] * spec["group_size"],
            **generation,
        },
        loss={"mask_truncated": False},
        optim={"lr": 1e-5, "micro_batch_size": spec["micro_batch_size"]},
        run={
            "steps": spec["warmup_steps"] + spec["steps"],
            "tracking": False,
            "output_dir": str(out),
            "precision": spec["precision"],
        },
    )


def _train(spec: dict[str, Any], config: Any) -> dict[str, Any]:
    import lucky_digit
    import torch

    from vfops.training import GRPORecipe

    env = lucky_digit.load_environment(digits="0123456789", num_train_examples=256)
    started = time.perf_counter()
    with GRPORecipe(config, environment=env) as recipe:
        recipe.setup()
        setup_s = time.perf_counter() - started
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        steps = [recipe.train_step() for _ in range(config.run.steps)]
        parameters = sum(p.numel() for p in recipe.policy_model.parameters())
        mixed = str(recipe.accelerator.mixed_precision)
    measured = steps[spec["warmup_steps"] :]
    keys = (
        "step_s",
        "generation_s",
        "training_s",
        "weight_sync_s",
        "completion_tokens",
        "tokens_per_s",
        "generation_tokens_per_s",
        "training_tokens_per_s",
        "mismatch_kl",
        "mismatch_ratio_max",
        "mismatch_ratio_min",
        "is_capped_fraction",
        "reward_mean",
    )
    result: dict[str, Any] = {
        "parameters": parameters,
        "mixed_precision": mixed,
        "setup_s": round(setup_s, 2),
        "warmup_steps": spec["warmup_steps"],
        # seconds rounded; the mismatch kept whole (a matched sampler reads ~1e-13)
        "steps": [{k: _rounded(k, float(s[k])) for k in keys} for s in measured],
    }
    for key in ("step_s", "generation_s", "training_s", "weight_sync_s", "tokens_per_s"):
        values = sorted(float(s[key]) for s in measured)
        result[f"median_{key}"] = round(values[len(values) // 2], 5)
    total_step = sum(float(s["step_s"]) for s in measured)
    result["sync_share"] = round(sum(float(s["weight_sync_s"]) for s in measured) / total_step, 5)
    result["mismatch_kl_max"] = max(float(s["mismatch_kl"]) for s in measured)
    if torch.cuda.is_available():
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return result


def _rounded(key: str, value: float) -> float:
    return value if key.startswith(("mismatch", "is_")) else round(value, 5)


def part_hf(spec: dict[str, Any]) -> dict[str, Any]:
    return _train(spec, _config(spec, "hf", Path(spec["work"]) / "hf"))


def part_vllm_sync(spec: dict[str, Any]) -> dict[str, Any]:
    sync_dir = Path(spec["sync_dir"])
    config = _config(
        spec,
        "vllm",
        Path(spec["work"]) / f"vllm-{spec['sync']}",
        base_url=spec["base_url"],
        sync=spec["sync"],
        sync_dir=str(sync_dir),
    )
    return {"sync": spec["sync"], **_train(spec, config)}


def part_vllm_generation(spec: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from vfops.training._vllm import VLLMBackend, VLLMGenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True)
    config = VLLMGenerationConfig(base_url=spec["base_url"], sync_dir=spec["sync_dir"])
    rollouts, max_tokens = spec["generation_rollouts"], spec["generation_max_tokens"]

    async def run() -> dict[str, Any]:
        backend = VLLMBackend.from_config(config, tokenizer)
        limiter = asyncio.Semaphore(spec["generation_concurrency"])
        args = {"temperature": 1.0, "max_tokens": max_tokens}

        async def one(i: int) -> int:
            messages = [{"role": "user", "content": f"Count from {i} upwards, digits only."}]
            async with limiter:
                response = await backend.client.chat(
                    model="m", messages=messages, sampling_args=args
                )
            return len(response.raw["vfops_tokens"]["completion_ids"])  # type: ignore[index]

        await one(0)  # warm-up: first request compiles
        started = time.perf_counter()
        tokens = await asyncio.gather(*(one(i) for i in range(rollouts)))
        wall = time.perf_counter() - started
        await backend.aclose()
        return {
            "rollouts": rollouts,
            "max_tokens": max_tokens,
            "concurrency": spec["generation_concurrency"],
            "completion_tokens": sum(tokens),
            "wall_s": round(wall, 3),
            "tokens_per_s": round(sum(tokens) / wall, 1),
        }

    return asyncio.run(run())


def _token_batch(spec: dict[str, Any], vocab: int) -> Any:
    """A fixed batch of sequences of varied lengths (seeded): prompt then completion, the
    completion trained, behaviour log-probs near a random model's, advantages +-1."""
    import random

    from vfops.training._batch import Batch, Sample
    from vfops.training._tokens import Sequence

    rng = random.Random(0)
    samples = []
    for i in range(spec["tokens_sequences"]):
        prompt = rng.randint(*spec["tokens_prompt"])
        completion = rng.randint(*spec["tokens_completion"])
        ids = [rng.randrange(3, vocab) for _ in range(prompt + completion)]
        mask = [0] * prompt + [1] * completion
        old = [-7.0 * m for m in mask]
        samples.append(Sample(Sequence(ids, mask, old, 0), 1.0 if i % 2 else -1.0))
    return Batch(0, samples, [0.0] * len(samples), 0.0, 0, 0, len(samples), 0)


def _computed_tokens(batch: Any, micro_batches: int, packing: bool) -> int:
    """Tokens the model runs on per step: the real ones packed, the padded rows padded."""
    from vfops.training._batch import split

    if packing:
        return sum(len(s.sequence.input_ids) for s in batch.samples)
    chunks = split(batch.samples, micro_batches)
    return sum(len(c) * max(len(s.sequence.input_ids) for s in c) for c in chunks if c)


def _timed_step(step: Any, batch: Any) -> tuple[float, float | None]:
    """One optimiser step: its seconds, and its peak GPU memory in GiB (None on a CPU)."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    step.run(batch)
    if not cuda:
        return time.perf_counter() - started, None
    torch.cuda.synchronize()
    return time.perf_counter() - started, torch.cuda.max_memory_allocated() / 2**30


def _time_modes(steps: dict[str, Any], batch: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Each mode's step timed in turn, round after round (padded, packed, padded, ...), so
    a drift in the machine's speed (a shared CPU's load, GPU clocks) hits both alike."""
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    peaks: dict[str, float] = {}
    for i in range(spec["tokens_warmup_steps"] + spec["tokens_steps"]):
        for mode, step in steps.items():
            seconds, peak = _timed_step(step, batch)
            if i >= spec["tokens_warmup_steps"]:
                times[mode].append(seconds)
            if peak is not None:
                peaks[mode] = max(peaks.get(mode, 0.0), peak)
    tokens = sum(len(s.sequence.input_ids) for s in batch.samples)
    result: dict[str, Any] = {}
    for mode, step in steps.items():
        median = sorted(times[mode])[len(times[mode]) // 2]
        micro_batches, packing = step.policy.micro_batches, step.optim.packing
        result[mode] = {
            "tokens": tokens,
            "computed_tokens": _computed_tokens(batch, micro_batches, packing),
            "steps_s": [round(t, 5) for t in times[mode]],
            "median_step_s": round(median, 5),
            "tokens_per_s": round(tokens / median, 1),
            **({"peak_memory_gib": round(peaks[mode], 2)} if mode in peaks else {}),
        }
    return result


def part_train_tokens(spec: dict[str, Any]) -> dict[str, Any]:
    """Training tokens/s of padded and packed micro-batches, one attention implementation:
    the optimiser step alone (generation does not change with either), on one policy."""
    from vfops.training._optimizer_step import OptimizerStep
    from vfops.training._setup import attention, build_accelerator, load_model, prepare_policy

    shape = {  # micro-batches per step: tokens_sequences / tokens_micro_batch_size
        "prompts_per_step": spec["tokens_sequences"] // 2,
        "group_size": 2,
        "micro_batch_size": spec["tokens_micro_batch_size"],
    }
    config = _config(
        {**spec, **shape}, "hf", Path(spec["work"]) / f"tokens-{spec['attn']}"
    ).with_overrides({"model.attn_implementation": spec["attn"]})
    accelerator, micro_batches = build_accelerator(config)
    attn = attention(config, accelerator)
    model, tokenizer, ref_model = load_model(config, accelerator, attn)
    policy = prepare_policy(
        config,
        accelerator,
        model,
        tokenizer=tokenizer,
        ref_model=ref_model,
        micro_batches=micro_batches,
        attn_implementation=attn,
    )
    batch = _token_batch(spec, len(tokenizer))
    result: dict[str, Any] = {
        "attn_implementation": attn,
        "sequences": len(batch.samples),
        "micro_batch_size": spec["tokens_micro_batch_size"],
        "micro_batches": micro_batches,
    }
    steps = {
        mode: OptimizerStep(
            policy,
            loss=config.loss,
            optim=config.optim.model_copy(update={"packing": packing}),
            generation=config.generation,
        )
        for mode, packing in (("padded", False), ("packed", True))
    }
    result.update(_time_modes(steps, batch, spec))
    result["packed_speedup"] = round(
        result["packed"]["tokens_per_s"] / result["padded"]["tokens_per_s"], 3
    )
    return result


PARTS = {
    "hf": part_hf,
    "vllm_generation": part_vllm_generation,
    "vllm_sync": part_vllm_sync,
    "train_tokens": part_train_tokens,
}


def run_part(name: str, spec: dict[str, Any], timeout_s: float, env: dict[str, str]) -> Any:
    """``name`` in a subprocess of this script, at most ``timeout_s``; its result or error."""
    work = Path(spec["work"])
    spec_file, result_file = work / f"{name}-spec.json", work / f"{name}-result.json"
    spec_file.write_text(json.dumps(spec))
    log = work / f"{name}.log"
    started = time.perf_counter()
    cmd = [sys.executable, __file__, "--part", name, str(spec_file), str(result_file)]
    with log.open("wb") as fh:
        try:
            done = subprocess.run(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return {"error": f"did not finish within {timeout_s:.0f} s", "log_tail": _tail(log)}
    wall = round(time.perf_counter() - started, 2)
    if done.returncode != 0 or not result_file.is_file():
        return {"error": f"exit {done.returncode}", "wall_s": wall, "log_tail": _tail(log)}
    return {**json.loads(result_file.read_text()), "wall_s": wall}


def _tail(log: Path, chars: int = 1500) -> str:
    return " ".join(log.read_text(errors="replace")[-chars:].split())


# ---------------------------------------------------------------- vLLM server


class Server:
    """A vLLM server started with ``vfops vllm serve``'s command line."""

    def __init__(self, python: str, model_dir: Path, sync: str, cpu: bool, work: Path) -> None:
        from vfops._net import free_port
        from vfops.cli._vllm import serve_command, serve_env

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"vllm-{sync}.log"
        cmd = serve_command(
            model_dir,
            python=python,
            port=self.port,
            sync=sync,  # type: ignore[arg-type]
            dtype="float32" if cpu else "bfloat16",
            max_model_len=1024,
            gpu_memory_utilization=None if cpu else 0.3,
            # a CPU rehearsal checks that every part runs, not how fast: torch.compile's
            # warm-up is half a CPU server's start (measured 53 -> 27 s); a GPU keeps it
            extra_args=["--enforce-eager"] if cpu else None,
        )
        env = serve_env(cpu=cpu)
        if not cpu:
            env["CUDA_VISIBLE_DEVICES"] = "0"
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}): {_tail(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - started
            except OSError:
                time.sleep(1.0)
        raise TimeoutError(f"vLLM not ready after {timeout_s:.0f} s: {_tail(self.log)}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- driver


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def build_model(work: Path, cpu: bool) -> tuple[Path, int]:
    from vfops.local import TinyModelConfig, build_tiny_model
    from vfops.local._tiny import parameter_count

    shape = TinyModelConfig(**(CPU_MODEL if cpu else GPU_MODEL))
    model_dir = build_tiny_model(work / "model", config=shape, seed=0)
    return model_dir, parameter_count(model_dir)


def workload(args: argparse.Namespace, work: Path, model_dir: Path) -> dict[str, Any]:
    cpu = args.cpu
    return {
        "work": str(work),
        "model_dir": str(model_dir),
        "precision": "fp32" if cpu else "bf16",
        "prompts_per_step": 2 if cpu else 16,
        "group_size": 4 if cpu else 8,
        "max_tokens": 8 if cpu else 64,
        "micro_batch_size": 8 if cpu else 64,
        "warmup_steps": 1 if cpu else 2,
        "steps": 2 if cpu else args.steps,
        "generation_rollouts": 16 if cpu else 512,
        "generation_max_tokens": 16 if cpu else 128,
        "generation_concurrency": 16 if cpu else 256,
        # train_tokens: sequences of varied lengths (uniform prompt and completion
        # lengths, so padding is ~a third of a padded micro-batch)
        "tokens_sequences": 8 if cpu else 128,
        "tokens_micro_batch_size": 4 if cpu else 16,
        "tokens_prompt": [4, 16] if cpu else [32, 256],
        "tokens_completion": [2, 40] if cpu else [16, 768],
        "tokens_warmup_steps": 1 if cpu else 2,
        "tokens_steps": 2 if cpu else 5,
    }


def train_tokens_parts(
    args: argparse.Namespace,
    spec: dict[str, Any],
    budget: Budget,
    report: dict[str, Any],
    save: Any,
) -> None:
    """One train_tokens part per attention implementation this machine can run."""
    for attn in ATTENTION:
        name = f"train_tokens_{attn}"
        if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            report["parts"][name] = {"skipped": "flash-attn not installed"}
        elif attn == "flash_attention_2" and args.cpu:
            report["parts"][name] = {"skipped": "flash-attn needs a CUDA GPU (--cpu)"}
        elif budget.left() < PART_MIN_S["train_tokens"]:
            report["parts"][name] = {"skipped": f"budget: {budget.left():.0f} s left"}
        else:
            deadline = min(TRAIN_TOKENS_S, budget.left() - 15)
            report["parts"][name] = run_part(
                "train_tokens", {**spec, "attn": attn}, deadline, dict(os.environ)
            )
        save()


def vllm_parts(
    args: argparse.Namespace,
    spec: dict[str, Any],
    python: str,
    budget: Budget,
    report: dict[str, Any],
    save: Any,
) -> None:
    cpu = args.cpu
    work = Path(spec["work"])
    gpus = report["machine"]["gpus"]
    modes = ["filesystem"] + (["nccl"] if not cpu else [])
    for sync in modes:
        name = f"vllm_sync_{sync}"
        if sync == "nccl" and gpus < 2:
            report["parts"][name] = {
                "skipped": f"{gpus} GPU: NCCL sync needs the trainer and the vLLM server on "
                "different GPUs (NCCL refuses two ranks on one device)"
            }
            save()
            continue
        if budget.left() < PART_MIN_S["vllm_sync"] + 60:
            report["parts"][name] = {"skipped": f"budget: {budget.left():.0f} s left"}
            save()
            continue
        sync_dir = tempfile.mkdtemp(
            prefix="vfops-sync-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
        server = Server(python, Path(spec["model_dir"]), sync, cpu, work)
        try:
            start_s = server.wait_ready(
                min(SERVER_START_S["cpu" if cpu else "cuda"], budget.left() - 30)
            )
        except (RuntimeError, TimeoutError) as exc:
            server.stop()
            report["parts"][name] = {"error": f"vLLM server: {exc}"}
            save()
            continue
        try:
            part_spec = {**spec, "base_url": server.url, "sync": sync, "sync_dir": sync_dir}
            env = dict(os.environ)
            if sync == "nccl":
                env["CUDA_VISIBLE_DEVICES"] = "1"  # the server holds GPU 0
            if sync == "filesystem":
                report["parts"]["vllm_generation"] = {
                    "server_start_s": round(start_s, 1),
                    **run_part("vllm_generation", part_spec, max(budget.left() - 60, 10), env),
                }
                save()
            report["parts"][name] = {
                "server_start_s": round(start_s, 1),
                **run_part("vllm_sync", part_spec, max(budget.left() - 10, 10), env),
            }
            save()
        finally:
            server.stop()
            shutil.rmtree(sync_dir, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--part":
        name, spec_file, result_file = sys.argv[2:]
        result = PARTS[name](json.loads(Path(spec_file).read_text()))
        Path(result_file).write_text(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_check.json", help="the JSON file to write")
    parser.add_argument("--cpu", action="store_true", help="rehearse on a CPU (fp32, tiny model)")
    parser.add_argument("--vllm-python", default=None, help="a Python that imports vllm")
    parser.add_argument("--budget-s", type=float, default=450.0, help="the whole run's budget")
    parser.add_argument("--steps", type=int, default=6, help="measured GRPO steps per part")
    parser.add_argument("--skip-vllm", action="store_true", help="the hf part only")
    args = parser.parse_args()
    started = time.monotonic()
    budget = Budget(args.budget_s)
    out = Path(args.out)
    report: dict[str, Any] = {"script": "bench/gpu/gpu_check.py", "parts": {}}

    def save() -> None:
        report["total_s"] = round(time.monotonic() - started, 1)
        out.write_text(json.dumps(report, indent=2) + "\n")

    missing = missing_modules(TRAINER_NEEDS)
    if args.skip_vllm:
        python, vllm_version = None, "--skip-vllm"
        report["vllm"] = {"skipped": vllm_version}
    else:
        python, vllm_version = vllm_python(args)
        report["vllm"] = vllm_version if python else {"missing": vllm_version}
    if missing:
        report["missing"] = missing
        save()
        print(
            f"missing for the trainer: {', '.join(missing)} (pip install {' '.join(missing)}, "
            "or carry them as wheels: bench/gpu/README.md); nothing was measured"
        )
        sys.exit(2)
    report["machine"] = machine(args.cpu)
    if not args.cpu and not report["machine"]["cuda_available"]:
        save()
        sys.exit("no CUDA device; rehearse on a CPU with --cpu")
    if python is None and not args.skip_vllm:
        print(f"{vllm_version}: the vLLM parts are skipped (pass --vllm-python)")
    work = Path(tempfile.mkdtemp(prefix="vfops-gpu-check-"))
    try:
        model_dir, parameters = build_model(work, args.cpu)
        spec = workload(args, work, model_dir)
        report["workload"] = {
            **{k: v for k, v in spec.items() if k not in {"work", "model_dir"}},
            "parameters": parameters,
        }
        save()
        # what the parts after it need (a hung hf part leaves them this much)
        after_hf = 150 + 2 * PART_MIN_S["train_tokens"]
        report["parts"]["hf"] = run_part(
            "hf", spec, max(budget.left() - after_hf, PART_MIN_S["hf"]), dict(os.environ)
        )
        save()
        train_tokens_parts(args, spec, budget, report, save)
        if python is not None:
            vllm_parts(args, spec, python, budget, report, save)
    finally:
        save()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=2))
    errors = [name for name, part in report["parts"].items() if "error" in part]
    if errors:
        sys.exit(f"parts that failed: {', '.join(errors)} (see {out})")


if __name__ == "__main__":
    main()
