"""The per-rollout tool server: a small dictionary of workshop terms behind one MCP tool.

verifiers launches this module (``python -m v1_lookup.dictionary``) once per rollout,
because the task, not the taskset, declares it (``LookupTask.toolsets``). Each server
counts the lookups of its own rollout in its state, so a server shared by mistake
between rollouts would show in the ``lookups`` metric."""

import verifiers.v1 as vf

TERMS: dict[str, str] = {
    "kiln": "an oven for firing pottery",
    "awl": "a pointed tool for piercing leather",
    "adze": "a cutting tool with an arched blade set at right angles to the handle",
    "loom": "a frame for weaving thread into cloth",
    "color": "the hue of a thing",
}


class DictionaryState(vf.State):
    lookups: int = 0


class DictionaryToolset(vf.Toolset[vf.ToolsetConfig, DictionaryState]):
    TOOL_PREFIX = "dictionary"

    @vf.tool
    def define(self, term: str) -> str:
        """Return the dictionary's definition of a term (or say there is none)."""
        self.state.lookups += 1
        return TERMS.get(term.strip().lower(), f"no definition of {term!r}")


if __name__ == "__main__":
    DictionaryToolset.run()
