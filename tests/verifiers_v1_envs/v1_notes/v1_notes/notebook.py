"""One notebook server for the whole taskset, written to by every rollout.

The taskset declares it (``NotesTaskset.toolsets``), so verifiers starts it once per
eval and every rollout calls the same process. What a rollout has jotted lives in that
rollout's state, not in the server: before each call the server fetches the calling
rollout's state from the interception's ``/state`` route and writes it back after, with
the key verifiers handed it when it started the server. The pause between the write and
the read back lets concurrent rollouts interleave: a notebook that kept one list for all
of them would answer with another rollout's words."""

import asyncio

import verifiers.v1 as vf
from pydantic import Field

LONGEST_WORD = 8


class NotebookState(vf.State):
    words: list[str] = Field(default_factory=list)


class NotebookConfig(vf.SharedToolsetConfig):
    pause_s: float = 0.05
    """Time between keeping a word and reading the notebook back."""


class NotebookToolset(vf.Toolset[NotebookConfig, NotebookState]):
    TOOL_PREFIX = "notebook"

    @vf.tool
    async def jot(self, word: str) -> str:
        """Keep one word in your notebook and return every word kept so far, comma-separated."""
        if len(word) > LONGEST_WORD:
            return f"not kept: the notebook takes words of at most {LONGEST_WORD} letters"
        self.state.words = [*self.state.words, word]
        await asyncio.sleep(self.config.pause_s)
        return ", ".join(self.state.words)


if __name__ == "__main__":
    NotebookToolset.run()
