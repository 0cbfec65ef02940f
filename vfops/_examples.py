"""The example environments and training configs that ship inside vfops.

They are package data (``vfops/templates/examples/``), so a ``pip install vfops``
outside any checkout reaches them by name: ``vfops env install --example arithmetic``,
``vfops train --example cpu_lucky_digit``. A checkout's ``environments/NAME`` and
``configs/train/NAME.toml`` are links to these same files (one copy in git).

An example config's relative paths resolve as if it were ``./configs/train/NAME.toml``
in the current folder (:data:`EXAMPLE_CONFIG_DIR`): its model and outputs land in
``./.vfops-train/``, never inside the installed package, and in a checkout's root
``--example NAME`` is exactly ``configs/train/NAME.toml``.
"""

from __future__ import annotations

from pathlib import Path

from vfops._errors import InvalidArgumentError

__all__ = [
    "EXAMPLES",
    "EXAMPLE_CONFIG_DIR",
    "example_config_dir",
    "example_config_path",
    "example_environment",
    "example_environments",
    "example_train_configs",
]

EXAMPLES = Path(__file__).resolve().parent / "templates" / "examples"
EXAMPLE_CONFIG_DIR = Path("configs") / "train"
"""Where an example config's relative paths resolve from, below the current folder."""


def example_environments() -> dict[str, Path]:
    """Name -> project folder (pyproject, module, README, tests) of every example."""
    root = EXAMPLES / "environments"
    return {
        path.name: path for path in sorted(root.iterdir()) if (path / "pyproject.toml").is_file()
    }


def example_train_configs() -> dict[str, Path]:
    """Name -> TOML file of every shipped training config."""
    return {path.stem: path for path in sorted((EXAMPLES / "train").glob("*.toml"))}


def _pick(kind: str, name: str, found: dict[str, Path], flag: str) -> Path:
    if name not in found:
        raise InvalidArgumentError(
            f"no example {kind} named {name!r}; pass {flag} with one of: {', '.join(found)}"
        )
    return found[name]


def example_environment(name: str) -> Path:
    """The example environment project ``name``; one line naming them all otherwise."""
    return _pick("environment", name, example_environments(), "--example")


def example_config_path(name: str) -> Path:
    """The shipped training config ``name``; one line naming them all otherwise."""
    return _pick("training config", name, example_train_configs(), "--example")


def example_config_dir() -> Path:
    """The folder an example config's relative paths resolve against (see the module)."""
    return Path.cwd() / EXAMPLE_CONFIG_DIR
