"""vfops: RL environments for LLMs, evaluated and trained at scale.

Public names are resolved lazily (PEP 562) so ``import vfops`` stays fast and
never loads torch, transformers, vllm or datasets until they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vfops._cpu_kernels import pin_cpu_kernels
from vfops._lazy import lazy_exports
from vfops._version import __version__

pin_cpu_kernels()  # before anything imports torch: the same CPU numbers on every x86 machine

_EXPORTS: dict[str, str] = {
    # environments
    "Environment": "vfops.envs",
    "SingleTurnEnv": "vfops.envs",
    "MultiTurnEnv": "vfops.envs",
    "ToolEnv": "vfops.envs",
    "StatefulToolEnv": "vfops.envs",
    "SandboxToolEnv": "vfops.envs",
    "EnvGroup": "vfops.envs",
    "load_environment": "vfops.envs",
    # rubrics and parsers
    "Rubric": "vfops.rubrics",
    "RubricGroup": "vfops.rubrics",
    "JudgeRubric": "vfops.rubrics",
    "MathRubric": "vfops.rubrics",
    "Parser": "vfops.parsers",
    "XMLParser": "vfops.parsers",
    "ThinkParser": "vfops.parsers",
    "MaybeThinkParser": "vfops.parsers",
    # clients and records
    "OpenAIClient": "vfops.clients",
    "ScriptedClient": "vfops.clients",
    "ChatResponse": "vfops.clients",
    "RolloutRecord": "vfops._rollout",
    "VfopsError": "vfops._errors",
    "Messages": "vfops._types",
    "Message": "vfops._types",
    "State": "vfops._types",
    "Info": "vfops._types",
    "SamplingArgs": "vfops._types",
}

__all__ = [
    "ChatResponse",
    "EnvGroup",
    "Environment",
    "Info",
    "JudgeRubric",
    "MathRubric",
    "MaybeThinkParser",
    "Message",
    "Messages",
    "MultiTurnEnv",
    "OpenAIClient",
    "Parser",
    "RolloutRecord",
    "Rubric",
    "RubricGroup",
    "SamplingArgs",
    "SandboxToolEnv",
    "ScriptedClient",
    "SingleTurnEnv",
    "State",
    "StatefulToolEnv",
    "ThinkParser",
    "ToolEnv",
    "VfopsError",
    "XMLParser",
    "__version__",
    "load_environment",
]

if TYPE_CHECKING:
    from vfops._errors import VfopsError
    from vfops._rollout import RolloutRecord
    from vfops._types import Info, Message, Messages, SamplingArgs, State
    from vfops.clients import ChatResponse, OpenAIClient, ScriptedClient
    from vfops.envs import (
        EnvGroup,
        Environment,
        MultiTurnEnv,
        SandboxToolEnv,
        SingleTurnEnv,
        StatefulToolEnv,
        ToolEnv,
        load_environment,
    )
    from vfops.parsers import MaybeThinkParser, Parser, ThinkParser, XMLParser
    from vfops.rubrics import JudgeRubric, MathRubric, Rubric, RubricGroup


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
