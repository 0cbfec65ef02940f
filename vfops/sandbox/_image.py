"""The base image: Debian minbase with python3, built locally from a recipe.

No image registry needs to be reachable: ``debootstrap`` fetches Debian packages from
the machine's own mirror (the one apt uses) and the root folder is imported into the
engine. The image's tag is the recipe's digest, so a changed recipe builds a new image
and an unchanged one is never rebuilt (``vfops sandbox build-image``; CI runs it at
every start and it returns at once).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

from vfops.sandbox._engine import ContainerEngine, SandboxError

IMAGE_NAME: Final = "localhost/vfops-sandbox"
RECIPE: Final = {
    "suite": "bookworm",
    "variant": "minbase",
    # python3 (its standard library: json, subprocess, ...); coreutils' timeout, tar and
    # sh come with minbase
    "include": ["python3"],
    "recipe": 1,
}
_DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"


def recipe_tag() -> str:
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()
    return digest[:12]


def default_image() -> str:
    """``VFOPS_SANDBOX_IMAGE``, else the base image of the current recipe."""
    configured = os.environ.get("VFOPS_SANDBOX_IMAGE")
    return configured or f"{IMAGE_NAME}:{recipe_tag()}"


def debian_mirror() -> str:
    """``VFOPS_SANDBOX_MIRROR``, else the first Debian URI apt is configured with."""
    configured = os.environ.get("VFOPS_SANDBOX_MIRROR")
    if configured:
        return configured
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for uri in re.findall(r"^URIs:\s*(\S+)", path.read_text(), flags=re.M):
            if "security" not in uri:
                return str(uri)
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for uri in re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", legacy.read_text(), flags=re.M):
            if "security" not in uri:
                return str(uri)
    return _DEFAULT_MIRROR


def build_base_image(engine: ContainerEngine, *, force: bool = False) -> tuple[str, bool]:
    """The base image's name, built if the engine lacks it; and whether it was built."""
    image = f"{IMAGE_NAME}:{recipe_tag()}"
    if not force and engine.image_digest(image) is not None:
        return image, False
    binary = getattr(engine, "binary", engine.name)
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "debootstrap is not installed; install it (apt-get install -y debootstrap)"
        )
    with tempfile.TemporaryDirectory(prefix="vfops-image-", dir="/var/tmp") as work:
        root = Path(work) / "root"
        done = subprocess.run(
            ["debootstrap", f"--variant={RECIPE['variant']}",
             f"--include={','.join(RECIPE['include'])}",  # type: ignore[arg-type]
             str(RECIPE["suite"]), str(root), debian_mirror()],
            capture_output=True,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            tail = done.stdout.decode(errors="replace").strip().splitlines()[-3:]
            raise SandboxError(
                f"debootstrap failed ({' / '.join(tail)}); check the mirror "
                f"({debian_mirror()}; VFOPS_SANDBOX_MIRROR sets another)"
            )
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [binary, "import", "--change", f"LABEL vfops.recipe={recipe_tag()}", "-", image],
            stdin=tar.stdout,
            capture_output=True,
            check=False,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            reason = imported.stderr.decode(errors="replace").strip()[-300:]
            raise SandboxError(f"{binary} import failed: {reason}")
    return image, True
