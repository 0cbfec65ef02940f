"""Environments: datasets, rollout procedures and rubrics."""

from vfops.envs._dataset import Example, format_dataset, iter_examples, quiet_datasets
from vfops.envs._env_group import EnvGroup
from vfops.envs._environment import Environment, Scorer
from vfops.envs._load_errors import load_failure
from vfops.envs._loading import (
    EnvironmentEntry,
    Library,
    environment_version,
    find_environment,
    installed_environments,
    load_environment,
    verifiers_environments,
)
from vfops.envs._multiturn import MultiTurnEnv, SingleTurnEnv
from vfops.envs._tool import StatefulToolEnv, ToolEnv
from vfops.envs._tool_schema import tool_schema

__all__ = [
    "EnvGroup",
    "Environment",
    "EnvironmentEntry",
    "Example",
    "Library",
    "MultiTurnEnv",
    "Scorer",
    "SingleTurnEnv",
    "StatefulToolEnv",
    "ToolEnv",
    "environment_version",
    "find_environment",
    "format_dataset",
    "installed_environments",
    "iter_examples",
    "load_environment",
    "load_failure",
    "quiet_datasets",
    "tool_schema",
    "verifiers_environments",
]
