"""Environments: datasets, rollout procedures and rubrics."""

from vfops.envs._dataset import Example, format_dataset
from vfops.envs._env_group import EnvGroup
from vfops.envs._environment import Environment, Scorer
from vfops.envs._loading import installed_environments, load_environment
from vfops.envs._multiturn import MultiTurnEnv, SingleTurnEnv
from vfops.envs._tool import StatefulToolEnv, ToolEnv
from vfops.envs._tool_schema import tool_schema

__all__ = [
    "EnvGroup",
    "Environment",
    "Example",
    "MultiTurnEnv",
    "Scorer",
    "SingleTurnEnv",
    "StatefulToolEnv",
    "ToolEnv",
    "format_dataset",
    "installed_environments",
    "load_environment",
    "tool_schema",
]
