"""A v1 taskset's run configuration from vfops's environment arguments.

``-a`` (and a sweep's or nightly spec's ``env_args``) sets the taskset's
``TasksetConfig`` fields, ``{"task": {...}}`` its ``TaskConfig``'s, validated by
``verifiers``' own config classes; a wrong one is refused in one line naming the field.
Each agent role (every seat of a multi-agent ``Env``) runs vfops's in-process harness
(``vfops``) on a local runtime: what a role's author pinned otherwise (a coding-agent CLI,
a container) is refused. ``verifiers`` replaces entries of the arguments it is handed
(a judge's dict by its config object): ``vfops.envs.load_environment`` hands every loader
a deep copy, so that the run records the arguments as the user gave them.
"""

from __future__ import annotations

from typing import Any

from vfops._errors import InvalidArgumentError, VfopsError
from vfops.adapters._v1_harness import HARNESS_ID

_IN_PROCESS_HARNESSES = frozenset({"null", HARNESS_ID})
"""The harnesses whose loop vfops runs in-process: ``null`` is the one it replaces."""


def env_config(
    vf: Any, module: str, name: str, args: dict[str, Any], runtime: str = "subprocess"
) -> tuple[Any, list[str]]:
    """The run's ``EnvConfig``, and notes on what vfops runs differently from a plain
    ``vf-eval`` of the taskset (printed with the run's summary, kept in its metadata)."""
    from pydantic import ValidationError

    raw: dict[str, Any] = {"taskset": {**args, "id": module}}
    try:
        config = vf.resolve_env_config(raw)
    except ValidationError as exc:
        raise _argument_error(name, exc) from exc
    except (ModuleNotFoundError, TypeError, AttributeError) as exc:
        raise VfopsError(
            f"'{name}' is not a verifiers v1 taskset ({str(exc).splitlines()[0]}); a package "
            "written for verifiers' classic API runs with verifiers 0.3: pip install "
            "'vfops[verifiers]' in its own virtualenv"
        ) from exc
    notes = []
    for role, spec in _roles(config).items():
        if _check_harness(vf, name, module, spec) == _VERIFIERS_DEFAULT:
            notes.append(_default_harness_note(role))
        # a taskset whose tasks need a container: verifiers' own podman/docker runtime
        raw[role] = {"harness": {"id": HARNESS_ID}, "runtime": {"type": runtime}}
    return vf.resolve_env_config(raw), notes


_VERIFIERS_DEFAULT = "bash"
"""verifiers' harness for a role nothing pins: a coding agent (bash and edit tools run in
the rollout's runtime, its own system prompt). vfops runs the chat loop instead."""


def _default_harness_note(role: str) -> str:
    return (
        f"role '{role}' runs verifiers' chat loop (harness null) in-process, where a plain "
        "vf-eval runs its default 'bash' harness (a coding agent: bash and edit tools, its "
        f"own system prompt); compare with vf-eval --env.{role}.harness.id null"
    )


def _check_harness(vf: Any, name: str, module: str, spec: Any) -> str:
    """The harness verifiers would run for the role; refused when it is a program: a
    harness pinned by the role (but null) or shipped by the taskset. Unpinned, a taskset
    without a harness of its own runs verifiers' default, for which vfops runs the chat
    loop (and says so)."""
    pinned = spec.harness.id if spec.harness is not None else vf.default_harness_id(module)
    if pinned in _IN_PROCESS_HARNESSES or (spec.harness is None and pinned == _VERIFIERS_DEFAULT):
        return str(pinned)
    if spec.harness is None:  # default_harness_id names the taskset: it ships a harness
        raise VfopsError(
            f"taskset '{name}' ships its own harness (a program with its own runtime); vfops "
            "runs verifiers' chat harness (null) in-process: evaluate it with verifiers' own eval"
        )
    raise VfopsError(
        f"taskset '{name}' runs in the '{pinned}' harness, which needs its own program "
        "and runtime; vfops runs the tool-less chat harness (null) in-process"
    )


def _roles(config: Any) -> dict[str, Any]:
    from verifiers.v1.configs.agent import agent_config_fields

    found: dict[str, Any] = agent_config_fields(config)
    return found


def _argument_error(name: str, exc: Any) -> InvalidArgumentError:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"][1:]) or "taskset"
    return InvalidArgumentError(
        f"taskset '{name}': argument '{where}': {first['msg']}; "
        "set its TasksetConfig fields with -a '{\"field\": value}' and its TaskConfig's "
        'under "task"'
    )
