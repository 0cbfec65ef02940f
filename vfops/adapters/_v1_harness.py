"""vfops's harness for v1 tasks: ``verifiers``' tool-less ``null`` chat harness, run as a
loop in this process instead of a program launched per rollout.

``NullHarness`` launches a bundled chat program (``uv run`` in the rollout's runtime) that
posts each turn to the interception server, runs the task's MCP tools and stops at the
first reply without tool calls. :class:`InProcessChatHarness` is that loop, kept as
``verifiers.v1.harnesses.utils.core.run_chat_loop`` has it (the same prompt placement,
tool-result bounding, tool gate and error strings for bad tool arguments), with each turn
handed to the interception's route handler in-process (:mod:`vfops.adapters._v1_transport`)
— what ``Harness.launch`` allows: "a harness may run its loop in-process instead of
launching a program, as long as every model call goes through endpoint + secret". So a
rollout is its model calls: no process, no ``uv``. Differences, on purpose: no retry of a
failed turn here (vfops's client has retried it already, with its budgets), and no context
compaction (off by default in ``null`` too).

Its id is ``vfops`` (``--env.agent.harness.id vfops``; recorded on every trace): ``verifiers``
finds harnesses by importing ``verifiers.v1.harnesses.<id>``, so :func:`install` puts this
module there, in this process only.
"""

from __future__ import annotations

import json
import sys
from contextlib import AsyncExitStack
from typing import Any

from verifiers.v1.clients import ModelContext
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.null import NullHarness
from verifiers.v1.harnesses.utils.compaction import CONTEXT_OVERFLOW_MARKERS, bound_tool_message
from verifiers.v1.harnesses.utils.mcp import connect_mcp, mcp_content_to_chat_content
from verifiers.v1.runtimes import ProgramResult, Runtime
from verifiers.v1.task import TaskData
from verifiers.v1.trace import Trace

from vfops._errors import VfopsError
from vfops.adapters._v1_transport import (
    InProcessInterception,
    ToolTally,
    current_ledger,
    interception_at,
)

HARNESS_ID = "vfops"
_MODULE = f"verifiers.v1.harnesses.{HARNESS_ID}"


class InProcessChatHarness(NullHarness):  # type: ignore[misc]
    """The ``null`` harness's chat loop, in-process (see the module docstring)."""

    async def setup(self, runtime: Runtime) -> None:
        """Nothing to install: the loop is this process."""

    async def launch(
        self,
        ctx: ModelContext,
        trace: Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        interception = interception_at(endpoint) or interception_at(_unproxied(endpoint, runtime))
        if interception is None:
            raise VfopsError(
                f"the vfops harness runs only under vfops (no in-process interception at "
                f"{endpoint}); evaluate with: vfops eval TASKSET"
            )
        system_prompt, prompt = self.resolve_prompt(data)
        messages = _opening(system_prompt, prompt)
        loop = _ChatLoop(interception, secret, ctx.model, gated=tool_interception_url is not None)
        found = current_ledger()
        if found is not None:
            loop.tally = found.tools.setdefault(trace.id, ToolTally())
        try:
            async with AsyncExitStack() as stack:
                if mcp_urls:
                    await loop.connect(mcp_urls, self.config.tool_timeout, stack)
                return await loop.run(messages)
        except BaseExceptionGroup as group:
            # the MCP client's task group wraps what failed (a server it cannot reach):
            # the trace's error names that cause, not "unhandled errors in a TaskGroup"
            raise _leaf(group) from group


def _unproxied(endpoint: str, runtime: Runtime) -> str:
    """The interception's own URL behind the callback a container runtime gave the harness
    (``http://<proxy>/.vf-host/<token>/v1``: what a program in the container would call).
    The loop runs here, in the eval's process: it talks to the interception directly."""
    from urllib.parse import urlsplit

    path = urlsplit(endpoint).path
    if not path.startswith(_CALLBACK_PREFIX):
        return endpoint
    token, _, rest = path.removeprefix(_CALLBACK_PREFIX).partition("/")
    callbacks = getattr(getattr(runtime, "_proxy", None), "_callbacks", None) or {}
    callback = callbacks.get(token)
    if callback is None:
        return endpoint
    return f"{callback.scheme}://{callback.authority}/{rest}"


_CALLBACK_PREFIX = "/.vf-host/"
"""verifiers' Docker/Podman runtimes route a container's calls to the host through their
egress proxy under this path (``verifiers/v1/runtimes/docker/egress.py``)."""


def _opening(system_prompt: str | None, prompt: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt is not None:
        messages.extend(message_to_wire(message) for message in prompt)
    return messages


class _ChatLoop:
    """One segment of ``run_chat_loop``: turns until a reply without tool calls."""

    def __init__(
        self, interception: InProcessInterception, secret: str, model: str, *, gated: bool
    ) -> None:
        self.interception = interception
        self.secret = secret
        self.model = model
        self.gated = gated
        self.tools: list[dict[str, Any]] = []
        self.dispatch: dict[str, tuple[str, str]] = {}
        self.servers: dict[str, Any] = {}
        self.tally = ToolTally()

    async def connect(self, urls: dict[str, str], limit_s: float, stack: AsyncExitStack) -> None:
        servers = {name: {"url": url, "timeout": limit_s} for name, url in urls.items()}
        config = {"mcpServers": servers}
        self.tools, self.dispatch, self.servers = await connect_mcp(config, stack)

    async def run(self, messages: list[dict[str, Any]]) -> ProgramResult:
        while True:
            body: dict[str, Any] = {"model": self.model, "messages": messages}
            if self.tools:
                body["tools"] = self.tools
            status, reply = await self.interception.chat(self.secret, body)
            if status >= 400:
                return _failed_turn(status, reply)
            message = reply["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            calls = message.get("tool_calls") or []
            if not calls:
                return ProgramResult(exit_code=0, stdout="", stderr="")
            for call in calls:
                result = await self._tool_result(call)
                if result is None:  # the gate stopped the rollout
                    return ProgramResult(exit_code=1, stdout="", stderr="rollout stopped")
                messages.append(result)

    async def _tool_result(self, call: dict[str, Any]) -> dict[str, Any] | None:
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        raw = function.get("arguments") or "{}"
        if self.gated:
            try:
                arguments: object = json.loads(raw)
            except json.JSONDecodeError:
                arguments = raw
            decision = await self.interception.decide_tool(self.secret, call["id"], name, arguments)
            if decision["action"] == "stop":
                return None
            if decision["action"] == "deny":
                denied: dict[str, Any] = bound_tool_message(decision["message"])
                return denied
        content = await self._run_tool(name, raw)
        message = {"role": "tool", "tool_call_id": call["id"], "content": content, "name": name}
        bounded: dict[str, Any] = bound_tool_message(message)
        return bounded

    async def _run_tool(self, name: str, raw: str) -> Any:
        content, error = await self._call_tool(name, raw)
        self.tally.add(error)
        return content

    async def _call_tool(self, name: str, raw: str) -> tuple[Any, str | None]:
        """The tool's answer, which the model reads back (the same answers as verifiers'
        chat program), and its failure's text when it failed (counted, never scored)."""
        try:
            arguments = json.loads(raw)
        except json.JSONDecodeError as exc:
            text = f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
            return text, text
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            text = f"error: tool arguments must be a JSON object, got {kind}; resend as an object"
            return text, text
        if name not in self.dispatch:
            return f"error: unknown tool {name!r}", f"unknown tool {name!r}"
        # call_mcp's own steps, keeping the result's isError flag that it drops
        server_name, tool = self.dispatch[name]
        result = await self.servers[server_name].run(
            lambda client: client.call_tool(tool, arguments)
        )
        content = mcp_content_to_chat_content(result.content)
        if not result.is_error:
            return content, None
        return content, f"{name}: {_text_of(content)}"


def _leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception in ``group`` that is not itself a group."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup) and found.exceptions:
        found = found.exceptions[0]
    return found


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return " ".join(part for part in parts if part) or "error result"


def _failed_turn(status: int, reply: dict[str, Any]) -> ProgramResult:
    """A refused or failed turn ends the segment as the chat program's crash on it would:
    a context overflow is a clean end (no compaction), anything else a non-zero exit the
    rollout reads as its recorded cause (a ``@stop``, a limit, the model call's error)."""
    detail = json.dumps(reply)
    if status in (400, 413) and any(m in detail.casefold() for m in CONTEXT_OVERFLOW_MARKERS):
        return ProgramResult(exit_code=0, stdout="", stderr=detail)
    return ProgramResult(exit_code=1, stdout="", stderr=f"model call returned {status}: {detail}")


__all__ = ["InProcessChatHarness"]


def install() -> None:
    """Make the harness loadable by id in this process (``verifiers`` imports
    ``verifiers.v1.harnesses.<id>`` and takes the ``Harness`` its ``__all__`` exports)."""
    sys.modules.setdefault(_MODULE, sys.modules[__name__])
