"""Environments: datasets, rollout procedures and rubrics, and the libraries they are
written against (``_library``: the plug-in protocol through which vfops's own, the
``verifiers`` adapter and any third library find, load and describe theirs)."""

from typing import TYPE_CHECKING

from vfops._lazy import lazy_exports
from vfops.envs._dataset import Example, format_dataset, iter_examples, quiet_datasets
from vfops.envs._env_group import EnvGroup
from vfops.envs._environment import Environment, Scorer
from vfops.envs._library import (
    EnvironmentEntry,
    EnvironmentLibrary,
    EnvironmentPackage,
    SourceReader,
    distribution_name,
    installed_source,
    requires,
)
from vfops.envs._load_errors import load_failure
from vfops.envs._loading import (
    LIBRARY_GROUP,
    environment_libraries,
    environment_library,
    environment_version,
    find_environment,
    installed_environments,
    library_of,
    load_environment,
    require_environment,
)
from vfops.envs._multiturn import MultiTurnEnv, SingleTurnEnv
from vfops.envs._tool import StatefulToolEnv, ToolEnv
from vfops.envs._tool_schema import tool_schema

__all__ = [
    "LIBRARY_GROUP",
    "EnvGroup",
    "Environment",
    "EnvironmentEntry",
    "EnvironmentLibrary",
    "EnvironmentPackage",
    "Example",
    "MultiTurnEnv",
    "SandboxToolEnv",
    "Scorer",
    "SingleTurnEnv",
    "SourceReader",
    "StatefulToolEnv",
    "ToolEnv",
    "distribution_name",
    "environment_libraries",
    "environment_library",
    "environment_version",
    "find_environment",
    "format_dataset",
    "installed_environments",
    "installed_source",
    "iter_examples",
    "library_of",
    "load_environment",
    "load_failure",
    "quiet_datasets",
    "require_environment",
    "requires",
    "tool_output",
    "tool_schema",
]

if TYPE_CHECKING:
    from vfops.envs._sandbox_tools import SandboxToolEnv, tool_output

# loaded on use: the sandbox's limits are a pydantic model, which an evaluation of any
# other environment never imports
__getattr__, __dir__ = lazy_exports(
    __name__,
    {"SandboxToolEnv": "vfops.envs._sandbox_tools", "tool_output": "vfops.envs._sandbox_tools"},
    __all__,
)
