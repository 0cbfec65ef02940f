"""A tool environment whose ``python`` and ``bash`` tools run in the rollout's sandbox."""

from __future__ import annotations

import asyncio
from typing import Any

from vfops._types import Messages, State
from vfops.envs._tool import StatefulToolEnv, Tool
from vfops.sandbox import ExecResult, Sandbox, SandboxLimits, SandboxPool

_BOX = "sandbox"
"""The hidden argument the tools receive: the rollout's sandbox (never in the schema)."""


async def python(code: str, sandbox: Sandbox) -> str:
    """Run Python 3 code in this conversation's sandbox and return what it printed.

    The sandbox is a Linux container with no network; files written in its working
    folder stay there for later calls in this conversation.

    Args:
        code: A complete Python program; print what you want to see.

    Returns:
        Its standard output and error, and how it ended when that was not a clean exit.
    """
    return tool_output(await sandbox.run_python(code))


async def bash(command: str, sandbox: Sandbox) -> str:
    """Run a shell command in this conversation's sandbox and return its output.

    The sandbox is a Linux container (Debian, python3, coreutils) with no network.

    Args:
        command: A shell command line, run with sh in the working folder.

    Returns:
        Its standard output and error, and how it ended when that was not a clean exit.
    """
    return tool_output(await sandbox.run(command))


def tool_output(result: ExecResult) -> str:
    """What the model reads back: the output, then how the command ended unless it exited
    cleanly (a failing command is the model's to fix, not a tool error)."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(result.stderr)
    if not result.ok:
        parts.append(f"[{result.describe()}]")
    if result.fresh_container:
        parts.append("[the sandbox was restarted after a limit: earlier files are gone]")
    return "\n".join(part for part in parts if part) or "(no output)"


class SandboxToolEnv(StatefulToolEnv):
    """The model runs code through ``python`` and ``bash`` tool calls, in a container of
    its own for the rollout (warm from a pool, removed when the rollout ends).

    ``limits`` are each container's (:class:`~vfops.sandbox.SandboxLimits`: no network,
    512 MiB, 64 processes, 30 s a command by default); ``pool_size`` containers are kept
    started ahead. The tools' results carry the command's output and, when it did not exit
    cleanly, how it ended: a failing or timed-out command is the model's to handle. A
    sandbox that cannot be had (no engine, no image) is the rollout's error, never a tool
    output the model could be scored on. Extra ``tools`` may take ``sandbox`` too.
    """

    def __init__(
        self,
        *,
        tools: list[Tool] | None = None,
        limits: SandboxLimits | None = None,
        image: str | None = None,
        pool_size: int = 2,
        **kwargs: Any,
    ) -> None:
        self.sandbox_limits = limits
        self.sandbox_image = image
        self.pool_size = pool_size
        self._pools: dict[asyncio.AbstractEventLoop, SandboxPool] = {}
        self._boxes: dict[int, tuple[Sandbox, Any]] = {}
        super().__init__(tools=[], **kwargs)
        for tool in [python, bash, *(tools or [])]:
            self.add_tool(tool, args_to_skip=[_BOX])

    def _pool(self) -> SandboxPool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = SandboxPool(self.pool_size, image=self.sandbox_image, limits=self.sandbox_limits)
            pool.fill()
            self._pools[loop] = pool
        return pool

    async def setup_state(self, state: State) -> State:
        lease = self._pool().sandbox()
        box = await lease.__aenter__()
        self._boxes[id(state)] = (box, lease)
        return await super().setup_state(state)

    async def cleanup_state(self, state: State) -> None:
        held = self._boxes.pop(id(state), None)
        if held is not None:
            await held[1].__aexit__(None, None, None)
        await super().cleanup_state(state)

    def update_tool_args(
        self, tool_name: str, tool_args: dict[str, Any], messages: Messages, state: State
    ) -> dict[str, Any]:
        return {**tool_args, _BOX: self._boxes[id(state)][0]}

    async def close_sandboxes(self) -> None:
        """Remove the warm containers of this event loop's pool (else removed at exit)."""
        pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            await pool.close()
