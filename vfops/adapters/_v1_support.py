"""What vfops runs of a v1 task, checked before any request, and the row it records."""

from __future__ import annotations

from typing import Any

from vfops._errors import VfopsError

_TASK_DATA_FIELDS = frozenset(
    {
        "idx", "id", "name", "description", "prompt", "system_prompt", "image", "workdir",
        "agent_user", "skills", "network_allow", "network_block", "artifacts",
        "artifact_max_bytes", "timeout", "resources",
    }
)  # fmt: skip
"""``TaskData``'s own fields: the rest of a task's data is the taskset's (its answer...)."""


def check_supported(name: str, task: Any) -> None:
    """Refuse, in one line naming what it needs, a task vfops does not run."""
    data = task.data
    where = f"task {data.idx} of taskset '{name}'"
    if data.agent_user or data.artifacts or data.resources.gpu:
        raise VfopsError(
            f"{where} needs a sandbox (agent_user, artifacts or a GPU); vfops runs v1 tasks "
            "in-process or in a container without them: run it with verifiers' own eval"
        )


def task_row(task: Any) -> dict[str, Any]:
    """The vfops row of a task: its opening messages, answer and identity."""
    data = task.data
    extra = data.model_dump(mode="json", exclude_none=True, exclude=_TASK_DATA_FIELDS)
    answer = extra.get("answer")
    prompt: list[dict[str, Any]] = []
    if data.system_prompt:
        prompt.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        prompt.append({"role": "user", "content": data.prompt})
    elif data.prompt is not None:
        from verifiers.v1.dialects.chat import message_to_wire

        prompt.extend(
            {k: v for k, v in message_to_wire(m).items() if v is not None} for m in data.prompt
        )
    info = {"task_key": task.key, "task_hash": task.hash, **extra}
    return {
        "prompt": prompt,
        "example_id": int(data.idx),
        "answer": "" if answer is None else str(answer),
        "info": info,
        "task": "default",
    }
